#!/usr/bin/python3
# A stand-in D-Bus service for the bus source tests (python3-dbus, GLib loop).
# Usage: bus-standin.py ADDRESS NAME STATE
# Owns NAME on the bus at ADDRESS, serves /standin with interface
# org.example.Standin: property State (s), methods Echo(s)->s, Fail(), Hang()
# (never answers). Prints "ready UNIQUE" once it owns the name, then reads
# commands on stdin, one per line, and prints "ok" after each:
#   state X       set State, emit PropertiesChanged with the new value
#   invalidate X  set State, emit PropertiesChanged with State invalidated
#   wrongtype     emit PropertiesChanged with State as an int32
#   ping X        emit signal org.example.Standin.Ping(s X)
#   sleep B       emit logind's org.freedesktop.login1.Manager.PrepareForSleep(b B)
#                 on /org/freedesktop/login1 (B: true or false; run as the
#                 stand-in for NAME org.freedesktop.login1)
#   hostile KIND  emit Ping with: args (255 arguments), array (10,000 strings),
#                 deep (a string in 64 nested variants), big (a 1 MiB string)
import sys
import dbus
import dbus.service
import dbus.mainloop.glib
from gi.repository import GLib

IFACE = "org.example.Standin"
address, name, state = sys.argv[1], sys.argv[2], sys.argv[3]
dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
bus = dbus.bus.BusConnection(address)


class Standin(dbus.service.Object):
    def __init__(self):
        super().__init__(bus, "/standin")
        self.state = state

    @dbus.service.method(dbus.PROPERTIES_IFACE, in_signature="ss", out_signature="v")
    def Get(self, interface, prop):
        if interface == IFACE and prop == "State":
            return dbus.String(self.state)
        raise dbus.exceptions.DBusException("no such property", name="org.freedesktop.DBus.Error.UnknownProperty")

    @dbus.service.method(dbus.PROPERTIES_IFACE, in_signature="s", out_signature="a{sv}")
    def GetAll(self, interface):
        return {"State": dbus.String(self.state)} if interface == IFACE else {}

    @dbus.service.signal(dbus.PROPERTIES_IFACE, signature="sa{sv}as")
    def PropertiesChanged(self, interface, changed, invalidated):
        pass

    @dbus.service.signal(IFACE, signature="s")
    def Ping(self, text):
        pass

    @dbus.service.method(IFACE, in_signature="s", out_signature="s")
    def Echo(self, text):
        return text

    @dbus.service.method(IFACE, in_signature="", out_signature="")
    def Fail(self):
        raise dbus.exceptions.DBusException("it failed on purpose", name="org.example.Error.Failed")

    @dbus.service.method(IFACE, in_signature="", out_signature="s", async_callbacks=("ok", "err"))
    def Hang(self, ok, err):
        pass  # never answers


obj = Standin()


def hostile(kind):
    msg = dbus.lowlevel.SignalMessage("/standin", IFACE, "Hostile")
    if kind == "args":
        msg.append(*(["x"] * 255), signature="s" * 255)
    elif kind == "array":
        msg.append(["e%d" % i for i in range(10000)], signature="as")
    elif kind == "deep":
        msg.append(dbus.String("deep", variant_level=64), signature="v")
    elif kind == "big":
        msg.append("x" * (1 << 20), signature="s")
    bus.send_message(msg)


def command(source, condition):
    line = sys.stdin.readline()
    if not line:
        loop.quit()
        return False
    words = line.split()
    if words[0] == "state":
        obj.state = words[1]
        obj.PropertiesChanged(IFACE, {"State": dbus.String(words[1])}, [])
    elif words[0] == "invalidate":
        obj.state = words[1]
        obj.PropertiesChanged(IFACE, dbus.Dictionary({}, signature="sv"), ["State"])
    elif words[0] == "wrongtype":
        obj.PropertiesChanged(IFACE, {"State": dbus.Int32(7)}, [])
    elif words[0] == "ping":
        obj.Ping(words[1])
    elif words[0] == "sleep":
        msg = dbus.lowlevel.SignalMessage("/org/freedesktop/login1", "org.freedesktop.login1.Manager", "PrepareForSleep")
        msg.append(words[1] == "true", signature="b")
        bus.send_message(msg)
    elif words[0] == "hostile":
        hostile(words[1])
    bus.flush()
    print("ok", flush=True)
    return True


bus.request_name(name, dbus.bus.NAME_FLAG_DO_NOT_QUEUE)
print("ready", bus.get_unique_name(), flush=True)
GLib.io_add_watch(sys.stdin, GLib.IO_IN | GLib.IO_HUP, command)
loop = GLib.MainLoop()
loop.run()
