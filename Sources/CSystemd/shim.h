// Thin shims for what Swift cannot call directly (macros, flexible array
// members). Everything else is called as declared by libsystemd's headers.
#ifndef RECONCILE_CSYSTEMD_SHIM_H
#define RECONCILE_CSYSTEMD_SHIM_H

#include <systemd/sd-event.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>
#include <systemd/sd-bus.h>
#include <sys/inotify.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <signal.h>
#include <pthread.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/if.h>
#include <linux/if_addr.h>
#include <errno.h>

/// The entry's name, or NULL when the event is about the watched inode itself.
static inline const char *CSystemd_inotify_event_name(const struct inotify_event *e) {
    return e->len > 0 ? e->name : (const char *)0;
}

/// The calling thread's id, for "runs on the loop thread" checks.
static inline unsigned long CSystemd_thread_id(void) {
    return (unsigned long)pthread_self();
}

/// Whether `signo` is blocked in the calling thread (1), not blocked (0), or -errno.
static inline int CSystemd_signal_is_blocked(int signo) {
    sigset_t current;
    int r = pthread_sigmask(SIG_BLOCK, (const sigset_t *)0, &current);
    if (r != 0) return -r;
    return sigismember(&current, signo);
}

/// Blocks `count` signals in the calling thread (threads started later inherit).
static inline int CSystemd_block_signals(const int *signals, int count) {
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < count; i++) sigaddset(&set, signals[i]);
    int r = pthread_sigmask(SIG_BLOCK, &set, (sigset_t *)0);
    return r == 0 ? 0 : -r;
}

/// sd_bus_message_append for one string argument (the C function is variadic).
static inline int CSystemd_bus_message_append_string(sd_bus_message *m, const char *s) {
    return sd_bus_message_append(m, "s", s);
}

/// sd_bus_message_append for two string arguments.
static inline int CSystemd_bus_message_append_strings(sd_bus_message *m, const char *a, const char *b) {
    return sd_bus_message_append(m, "ss", a, b);
}

/// sd_bus_message_read for one string (the C function is variadic).
static inline int CSystemd_bus_message_read_string(sd_bus_message *m, const char **s) {
    return sd_bus_message_read(m, "s", s);
}

/// sd_bus_message_read for one boolean.
static inline int CSystemd_bus_message_read_bool(sd_bus_message *m, int *b) {
    return sd_bus_message_read(m, "b", b);
}

/// sd_bus_message_read for three strings (NameOwnerChanged).
static inline int CSystemd_bus_message_read_3strings(sd_bus_message *m, const char **a, const char **b, const char **c) {
    return sd_bus_message_read(m, "sss", a, b, c);
}

// --- Effects: the main queue on the loop (Docs/Effects.md) ---
#include <unistd.h>
#include <sys/syscall.h>

/// Whether the calling thread is the process's main thread.
static inline int CSystemd_is_main_thread(void) {
    return getpid() == (pid_t)syscall(SYS_gettid);
}

/// libdispatch's run-loop integration of the main queue (exported by the
/// toolchain's libdispatch; what Foundation's RunLoop uses on Linux): an
/// eventfd that becomes readable when main-queue work is pending, and the
/// call that drains it. Only the main thread's loop may use them.
int _dispatch_get_main_queue_handle_4CF(void);
void _dispatch_main_queue_callback_4CF(void *msg);

#endif
