#!/usr/bin/env python3
"""Metacontroller's HelloWorld sync hook, the Python column of kubewasm's reconcile bench.

`sync()` is the hook logic of Metacontroller's "Create a Controller" tutorial
(https://github.com/metacontroller/metacontroller, docs/src/guide/create.md, Apache-2.0),
ported to Python 3. The server around it is the tutorial's `http.server`, with what a bench
needs: HTTP/1.1 so the client's connection is kept alive, no Nagle delay between the header
and body writes, no per-request log line, loopback and a free port (printed on stdout).

The request body is the bench's, the same for both webhooks: JSON Lines of a header, the
parent, the previous parent (`null` when none) and the children, each document as the sandbox
hands it to a guest. `do_POST` reads them and groups the children the way Metacontroller sends
them ({"Kind.apiVersion": {name: object}}) before calling `sync()`.
"""

import json
from http.server import BaseHTTPRequestHandler, HTTPServer


class Controller(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def sync(self, parent, children):
        # Compute status based on observed state.
        desired_status = {"pods": len(children["Pod.v1"])}

        # Generate the desired child object(s).
        who = parent.get("spec", {}).get("who", "World")
        desired_pods = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": parent["metadata"]["name"]},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "containers": [
                        {
                            "name": "hello",
                            "image": "busybox",
                            "command": ["echo", "Hello, %s!" % who],
                        }
                    ],
                },
            }
        ]

        return {"status": desired_status, "children": desired_pods}

    def do_POST(self):
        lines = self.rfile.read(int(self.headers.get("content-length"))).split(b"\n")
        parent = json.loads(lines[1])
        children = {"Pod.v1": {}}
        for line in lines[3:]:
            child = json.loads(line)
            key = "%s.%s" % (child["kind"], child["apiVersion"])
            children.setdefault(key, {})[child["metadata"]["name"]] = child
        desired = self.sync(parent, children)

        body = json.dumps(desired).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Controller)
print(server.server_address[1], flush=True)
server.serve_forever()
