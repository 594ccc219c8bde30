"""The wire: Hypercorn's connections with pyserve's containment (connection.py) and HTTP/2 streams
(h2_streams.py), and how a reply goes out (response.py: a JSON body or an SSE stream, framed by sse.py)."""
