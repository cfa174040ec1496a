#!/usr/bin/python3
# An independent D-Bus client (python3-dbus, GLib loop) for the serving tests.
# Usage: bus-client.py MODE ADDRESS NAME PATH [ARGS]
#   props ADDRESS NAME PATH IFACE...   GetAll of each interface and Get of each
#                                      property; prints one JSON object
#                                      {iface: {prop: value}} (variants as
#                                      {"variant": value, "level": n})
#   call ADDRESS NAME PATH IFACE METHOD SIG JSON-ARGS
#                                      one call; prints {"reply": [...]} or
#                                      {"error": name}
#   concurrent ADDRESS NAME PATH IFACE N
#                                      N callers (one connection each) call
#                                      Echo(s) at once; prints "ok N" when every
#                                      reply is its own text, else the failures
#   hangup ADDRESS NAME PATH IFACE METHOD now|sync
#                                      sends METHOD() and closes the connection
#                                      without waiting for its reply (sync: after
#                                      an Echo("sync") round trip, so the service
#                                      has dispatched METHOD); prints "sent UNIQUE"
#   own ADDRESS NAME SECONDS           takes NAME with REPLACE_EXISTING, prints
#                                      "owned", holds it SECONDS (or until killed);
#                                      "error NAME" (exit 1) when refused
import json
import sys
import time
import dbus
import dbus.mainloop.glib
from gi.repository import GLib

dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)


def plain(v, drop=0):
    level = max(0, getattr(v, "variant_level", 0) - drop)
    if isinstance(v, dbus.Dictionary):
        out = {str(k): plain(x) for k, x in v.items()}
    elif isinstance(v, (dbus.Array, dbus.Struct, list, tuple)):
        if isinstance(v, dbus.Array) and v.signature == "y":
            out = [int(x) for x in v]
        else:
            out = [plain(x) for x in v]
    elif isinstance(v, dbus.Boolean):
        out = bool(v)
    elif isinstance(v, (dbus.Byte, dbus.Int16, dbus.UInt16, dbus.Int32, dbus.UInt32, dbus.Int64, dbus.UInt64, int)):
        out = int(v)
    elif isinstance(v, (dbus.Double, float)):
        out = float(v)
    else:
        out = str(v)
    if level:
        return {"variant": out, "level": int(level)}
    return out


def typed(sig, value):
    return {"s": dbus.String, "i": dbus.Int32, "u": dbus.UInt32, "b": dbus.Boolean}[sig](value)


mode = sys.argv[1]
address = sys.argv[2]

if mode == "own":
    bus = dbus.bus.BusConnection(address)
    try:
        r = bus.request_name(sys.argv[3], dbus.bus.NAME_FLAG_REPLACE_EXISTING | dbus.bus.NAME_FLAG_DO_NOT_QUEUE)
    except dbus.exceptions.DBusException as e:
        print("error %s" % e.get_dbus_name(), flush=True)
        sys.exit(1)
    print("owned" if r == dbus.bus.REQUEST_NAME_REPLY_PRIMARY_OWNER else "not-owned %d" % r, flush=True)
    time.sleep(float(sys.argv[4]))
    sys.exit(0)

name, path = sys.argv[3], sys.argv[4]

if mode == "props":
    bus = dbus.bus.BusConnection(address)
    obj = bus.get_object(name, path, introspect=False)
    props = dbus.Interface(obj, dbus.PROPERTIES_IFACE)
    out = {}
    for iface in sys.argv[5:]:
        everything = props.GetAll(iface)
        # A property's value arrives in a variant: one level is the protocol's.
        one_by_one = {str(k): plain(props.Get(iface, k), 1) for k in everything.keys()}
        out[iface] = {str(k): plain(v, 1) for k, v in everything.items()}
        if one_by_one != out[iface]:
            print(json.dumps({"mismatch": iface, "get": one_by_one, "getall": out[iface]}))
            sys.exit(1)
    print(json.dumps(out, sort_keys=True))
elif mode == "call":
    bus = dbus.bus.BusConnection(address)
    iface, method, sig, args = sys.argv[5], sys.argv[6], sys.argv[7], json.loads(sys.argv[8])
    obj = bus.get_object(name, path, introspect=False)
    try:
        reply = obj.get_dbus_method(method, iface)(*[typed(s, a) for s, a in zip(sig, args)], signature=sig)
        if reply is None:
            reply = []
        elif not isinstance(reply, tuple):
            reply = [reply]
        print(json.dumps({"reply": [plain(x) for x in reply]}))
    except dbus.exceptions.DBusException as e:
        print(json.dumps({"error": e.get_dbus_name()}))
elif mode == "concurrent":
    iface, n = sys.argv[5], int(sys.argv[6])
    loop = GLib.MainLoop()
    buses = [dbus.bus.BusConnection(address) for _ in range(n)]
    left = [n]
    bad = []

    def done(i):
        def ok(text):
            if text != "caller-%d" % i:
                bad.append("%d got %s" % (i, text))
            finish()

        def err(e):
            bad.append("%d error %s" % (i, e.get_dbus_name()))
            finish()
        return ok, err

    def finish():
        left[0] -= 1
        if left[0] == 0:
            loop.quit()

    for i, b in enumerate(buses):
        ok, err = done(i)
        b.get_object(name, path, introspect=False).get_dbus_method("Echo", iface)(
            "caller-%d" % i, reply_handler=ok, error_handler=err, timeout=60)
    GLib.timeout_add_seconds(60, loop.quit)
    loop.run()
    print("ok %d" % n if not bad and left[0] == 0 else "failed %d left %s" % (left[0], bad[:5]), flush=True)
elif mode == "hangup":
    iface, method, when = sys.argv[5], sys.argv[6], sys.argv[7]
    bus = dbus.bus.BusConnection(address)
    msg = dbus.lowlevel.MethodCallMessage(name, path, iface, method)
    bus.send_message(msg)
    bus.flush()
    if when == "sync":
        bus.get_object(name, path, introspect=False).get_dbus_method("Echo", iface)("sync")
    print("sent %s" % bus.get_unique_name(), flush=True)
    bus.close()
else:
    sys.exit("unknown mode " + mode)
