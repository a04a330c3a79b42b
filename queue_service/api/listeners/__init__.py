"""The listeners' own limits and the browser listener: web.py serves Connect, gRPC-Web and the
console; web_hosts.py and web_limits.py bound who and how much; connection_limits.py holds the
gRPC listener's HTTP/2 limits."""
