"""The page of ``solve.py --serve`` (the top layer: imports utils/solve/ and everything below it; nothing imports it):
the HTTP layer and its checks, the request fields, the queue of solves."""
