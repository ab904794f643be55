"""A freedesktop notification service for tests: owns org.freedesktop.Notifications on the
session bus given in the environment and appends each `Notify` call to a JSON-lines file.

Strict like the real services (GDBus checks signatures): a call whose signature is not
`susssasa{sv}i` gets org.freedesktop.DBus.Error.InvalidArgs. Prints "ready" once the name is
owned. Usage: python notification_server.py CALLS.jsonl
"""

from __future__ import annotations

import json
import sys
from typing import TextIO

from jeepney import HeaderFields, MessageType, message_bus, new_error, new_method_return
from jeepney.io.blocking import open_dbus_connection

NAME = "org.freedesktop.Notifications"
SIGNATURE = "susssasa{sv}i"


def main() -> None:
    with open(sys.argv[1], "a", encoding="utf-8") as calls:
        serve(calls)


def serve(calls: TextIO) -> None:
    connection = open_dbus_connection(bus="SESSION")
    connection.send_and_get_reply(message_bus.RequestName(NAME))
    print("ready", flush=True)
    next_id = 1
    while True:
        msg = connection.receive()
        if msg.header.message_type is not MessageType.method_call:
            continue
        member = msg.header.fields.get(HeaderFields.member)
        signature = msg.header.fields.get(HeaderFields.signature, "")
        if member == "Notify" and signature == SIGNATURE:
            app, _, _, summary, body, _, _, expire = msg.body
            calls.write(json.dumps({"app": app, "summary": summary, "body": body,
                                    "expire": expire}) + "\n")
            calls.flush()
            connection.send(new_method_return(msg, "u", (next_id,)))
            next_id += 1
        elif member == "Notify":
            connection.send(new_error(msg, "org.freedesktop.DBus.Error.InvalidArgs", "s",
                                      (f"expected {SIGNATURE}, got {signature}",)))
        else:
            connection.send(new_error(msg, "org.freedesktop.DBus.Error.UnknownMethod", "s",
                                      (f"no method {member}",)))


if __name__ == "__main__":
    main()
