"""Quickstart: one node publishes typed values on a topic and reads them back.

    python bindings/python/examples/quickstart.py

A second process joins the same group with the node's membership service address:
`tidings.Node(gms="127.0.0.1:PORT")` (printed below).
"""

import tidings

quotes = tidings.Topic("quotes/eu", tidings.JSON)

# gms="private": a membership service of this node's own. Without it the node joins (or
# starts) the host's shared service at 127.0.0.1:17400, as the Rust library does.
with tidings.Node(gms="private") as node:
    print(f"node {node.id}, membership service at {node.gms_addr}")
    subscription = node.subscribe(quotes)  # in force when it returns
    publisher = node.publisher(quotes)
    handle = publisher.publish({"symbol": "ACME", "price": 12.5})
    handle.wait_stable(timeout=5)  # every member of the topic's regions has it
    message = subscription.recv(timeout=5)
    print(f"{message.value} on {message.topic!r} from node {message.origin}")
