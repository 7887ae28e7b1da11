# The code interpreter's Python, run inside the room's sandbox as room code (one process per
# context, a unit of whoever runs code in it). It reads one request per line on its standard
# input, {"id", "code", "env"}, runs the code in one namespace kept across requests, and
# writes JSON lines on its standard output for the server to pass on: what the code printed
# ("stdout", "stderr", as printed), the last expression's value ("result"), an exception
# ("error"), the count ("number_of_executions"), then "end". Every line carries the request's
# id. What the code (or a program it starts) writes to descriptors 1 and 2 is captured
# through pipes, never mixed into these lines.
import ast, codecs, json, os, sys, threading, time, traceback

proto = os.fdopen(os.dup(1), "w", buffering=1)
lock = threading.Lock()
current = {"id": None}


def send(message):
    message["id"] = current["id"]
    line = json.dumps(message) + "\n"
    with lock:
        proto.write(line)
        proto.flush()


MARK = b"\0coderoom-cell-end\0"


class Pump(threading.Thread):
    """Passes what is written to one descriptor on as it comes; MARK says a cell ended."""

    def __init__(self, fd, kind):
        super().__init__(daemon=True)
        self.fd, self.kind = fd, kind
        self.done = threading.Event()
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def emit(self, data):
        text = self.decoder.decode(data)
        if text:
            send({"type": self.kind, "text": text, "timestamp": time.time_ns() // 1000})

    def run(self):
        held = b""
        while True:
            data = os.read(self.fd, 65536)
            if not data:
                return
            held += data
            while True:
                at = held.find(MARK)
                if at < 0:
                    break
                self.emit(held[:at])
                held = held[at + len(MARK):]
                self.done.set()
            # All but what may be the start of a mark.
            cut = len(held)
            for k in range(min(len(MARK) - 1, len(held)), 0, -1):
                if MARK.startswith(held[-k:]):
                    cut = len(held) - k
                    break
            self.emit(held[:cut])
            held = held[cut:]


pumps = []
for fd, kind in ((1, "stdout"), (2, "stderr")):
    r, w = os.pipe()
    os.dup2(w, fd)
    os.close(w)
    pump = Pump(r, kind)
    pump.start()
    pumps.append(pump)
sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)

namespace = {"__name__": "__main__", "__builtins__": __builtins__}
count = 0
for line in sys.stdin:
    try:
        request = json.loads(line)
    except ValueError:
        continue
    current["id"] = request.get("id")
    count += 1
    saved = {}
    for key, value in (request.get("env") or {}).items():
        saved[key] = os.environ.get(key)
        os.environ[key] = str(value)
    value, error = None, None
    try:
        tree = ast.parse(request.get("code") or "", "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), namespace)
    except BaseException as e:
        error = {
            "type": "error",
            "name": type(e).__name__,
            "value": str(e),
            "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
        }
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    for pump in pumps:
        pump.done.clear()
    os.write(1, MARK)
    os.write(2, MARK)
    for pump in pumps:
        pump.done.wait(5)
    if error is not None:
        send(error)
    elif value is not None:
        try:
            text = repr(value)
        except Exception as e:
            text = "<unprintable %s: %s>" % (type(value).__name__, e)
        send({"type": "result", "text": text, "is_main_result": True})
    send({"type": "number_of_executions", "execution_count": count})
    send({"type": "end"})
