// Thin shims for what Swift cannot call directly (macros, flexible array
// members). Everything else is called as declared by libsystemd's headers.
//
// libc belongs to Glibc, not to this module. Swift's Glibc is the clang
// module SwiftGlibc, one umbrella header that includes <sys/socket.h>,
// <net/if.h>, <signal.h> ... textually. A libc header this module included
// itself became this module's too, and which of the two modules then owned
// SOCK_STREAM in a Swift file depended on which was loaded first (an
// incremental build could not find it; a clean one could), while
// <linux/if.h> read without <net/if.h> first gave IFF_UP another type than
// Glibc's. So SwiftGlibc is imported first: every libc header it covers is
// then already included (its guard macros are visible) and stays Glibc's,
// also when libsystemd's own headers include it. What Glibc lacks (the
// Linux uapi headers, eventfd, signalfd, syscall numbers) is this module's
// alone.
#ifndef RECONCILE_CSYSTEMD_SHIM_H
#define RECONCILE_CSYSTEMD_SHIM_H

#if __has_feature(modules)
#pragma clang module import SwiftGlibc
#endif

#include <systemd/sd-event.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>
#include <systemd/sd-bus.h>
// Not in Glibc: this module's.
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/if.h>
#include <linux/if_addr.h>
// In Glibc (already included above): for the shims below when read without modules.
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <signal.h>
#include <pthread.h>
#include <errno.h>
#include <unistd.h>
#include <spawn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>

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


// --- Descriptors, sockets and child processes (Docs/IO.md) ---
extern char **environ;

/// Spawns `file` (searched in PATH when it has no slash) with `argv` and
/// `envp` (NULL: this process's environment), in `cwd` (NULL: ours):
/// stdin on /dev/null, stdout and stderr onto `out` and `err`, every other
/// descriptor closed, default signal dispositions and an empty mask, in a
/// process group of its own (stopping it signals the group). Returns the pid, or -errno.
static inline int CSystemd_spawn(const char *file, char *const argv[], char *const envp[], const char *cwd, int out, int err) {
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int r = posix_spawn_file_actions_init(&fa);
    if (r != 0) return -r;
    r = posix_spawnattr_init(&at);
    if (r != 0) { posix_spawn_file_actions_destroy(&fa); return -r; }
    if (r == 0) r = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (r == 0) r = posix_spawn_file_actions_adddup2(&fa, out, 1);
    if (r == 0) r = posix_spawn_file_actions_adddup2(&fa, err, 2);
    if (r == 0) r = posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    if (r == 0 && cwd) r = posix_spawn_file_actions_addchdir_np(&fa, cwd);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    if (r == 0) r = posix_spawnattr_setsigmask(&at, &none);
    if (r == 0) r = posix_spawnattr_setsigdefault(&at, &all);
    if (r == 0) r = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    if (r == 0) r = posix_spawnattr_setpgroup(&at, 0);
    pid_t pid = -1;
    if (r == 0) r = posix_spawnp(&pid, file, &fa, &at, argv, envp ? envp : environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    return r == 0 ? (int)pid : -r;
}

/// The child's exit code or signal from a child source's siginfo:
/// `*exited` 1 and `*value` the status, or 0 and the signal.
static inline void CSystemd_child_status(const siginfo_t *si, int *exited, int *value) {
    *exited = si->si_code == CLD_EXITED;
    *value = si->si_status;
}

/// accept4 with SOCK_NONBLOCK | SOCK_CLOEXEC (not visible to Swift without _GNU_SOURCE).
int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);
static inline int CSystemd_accept(int fd, struct sockaddr *addr, socklen_t *len) {
    return accept4(fd, addr, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

/// A pipe whose two ends are close-on-exec (pipe2 is not visible to Swift
/// without _GNU_SOURCE); 0 or -errno.
int pipe2(int fds[2], int flags);
static inline int CSystemd_pipe_cloexec(int fds[2]) {
    return pipe2(fds, O_CLOEXEC) == 0 ? 0 : -errno;
}

/// SO_PEERCRED of a unix socket (struct ucred needs _GNU_SOURCE); 0 or -errno.
static inline int CSystemd_peer_credentials(int fd, int *pid, unsigned *uid, unsigned *gid) {
    struct { int pid; unsigned uid; unsigned gid; } cred;
    socklen_t size = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &size) != 0) return -errno;
    *pid = cred.pid;
    *uid = cred.uid;
    *gid = cred.gid;
    return 0;
}

/// `O_NONBLOCK` set on `fd`; 0 or -errno.
static inline int CSystemd_set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0) return -errno;
    if (flags & O_NONBLOCK) return 0;
    return fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ? -errno : 0;
}

// --- Signals forwarded to the loop's thread (Daemon/SignalForwarding.swift) ---

/// The calling thread's kernel thread id.
static inline int CSystemd_gettid(void) {
    return (int)syscall(SYS_gettid);
}

/// Queues `signo` with `info` (the sender's pid kept) on thread `tid` of
/// this process; errno preserved (called from a signal handler). The kernel
/// lets only the thread whose id is the pid pass a kill()-style `si_code`
/// on (EPERM elsewhere): from another thread it goes as SI_QUEUE, with the
/// sender's pid still in it.
static inline int CSystemd_forward_signal(int tid, int signo, const siginfo_t *info) {
    int saved = errno;
    siginfo_t copy = *info;
    long r = syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, signo, &copy);
    if (r != 0 && errno == EPERM) {
        copy.si_code = SI_QUEUE;
        r = syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, signo, &copy);
    }
    errno = saved;
    return (int)r;
}

#endif
