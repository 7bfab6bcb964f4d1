"""A client that writes its whole request body before it reads, as python's
http.client does (and Android's HttpURLConnection in fixed-length mode).

Usage: python3 write-first-client.py URL METHOD PATH HEADERS_JSON BODY_FILE [chunked] [rate=BYTES_PER_S]
With a rate, the body goes out in 16 KiB writes paced to it, as a phone on a slow link sends.
Prints one JSON line: {"status", "headers", "body", "ms"} or {"error", "ms"}.
"""
import http.client
import json
import sys
import time
from urllib.parse import urlsplit

url, method, path, headers_json, body_file = sys.argv[1:6]
chunked = 'chunked' in sys.argv[6:]
rate = next((int(a[5:]) for a in sys.argv[6:] if a.startswith('rate=')), 0)
target = urlsplit(url)
headers = json.loads(headers_json)
with open(body_file, 'rb') as f:
    body = f.read()
start = time.monotonic()
ms = lambda: round((time.monotonic() - start) * 1000)


def paced(data, size=16384):
    """Yield 16 KiB pieces no faster than `rate` bytes per second."""
    for at in range(0, len(data), size):
        due = start + at / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        yield data[at:at + size]


try:
    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=40)
    if chunked:
        pieces = [body[i:i + 65536] for i in range(0, len(body), 65536)]
        conn.request(method, path, body=iter(pieces), headers=headers, encode_chunked=True)
    elif rate > 0:
        conn.request(method, path, body=paced(body), headers={**headers, 'Content-Length': str(len(body))})
    else:
        conn.request(method, path, body=body, headers=headers)
    res = conn.getresponse()
    data = res.read()
    out = {'status': res.status, 'headers': {k.lower(): v for k, v in res.getheaders()}, 'body': data.decode('utf-8', 'replace'), 'ms': ms()}
except Exception as e:  # the client's own view of a failed exchange, e.g. BrokenPipeError
    out = {'error': type(e).__name__, 'detail': str(e), 'ms': ms()}
print(json.dumps(out))
