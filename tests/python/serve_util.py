"""A running `fmoe serve` for the tests: started on a free loopback port (--port 0
--port-file), ready once /health says 200, stopped with a signal."""
import http.client
import json
import signal
import subprocess
import time

from conftest import _build_dir


class Server:
    def __init__(self, tmp_path, *args, preexec=None, quiet=True):
        self.port_file = tmp_path / f"port-{time.monotonic_ns()}"
        exe = _build_dir() / "cmd" / "fmoe"
        assert exe.exists(), f"{exe} not built"
        self.proc = subprocess.Popen(
            [str(exe), "serve", "--port", "0", "--port-file", str(self.port_file),
             *(["--quiet"] if quiet else []), *map(str, args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"fmoe serve exited: {self.proc.stderr.read()}")
            if self.port_file.exists() and self.port_file.read_text().strip():
                if self.request("GET", "/health")[0] == 200:
                    return
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError("fmoe serve did not become ready")

    @property
    def port(self):
        return int(self.port_file.read_text())

    def client(self, api_key="none"):
        """The openai client on this server (the tests that call it skip without openai)."""
        import openai
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=api_key,
                             max_retries=0, timeout=120)

    def conn(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers dict, body bytes); a refused connection is status 0."""
        c = self.conn(timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        except (ConnectionError, OSError):
            return 0, {}, b""
        finally:
            c.close()

    def post(self, path, body, timeout=120):
        return self.request("POST", path, json.dumps(body),
                            {"Content-Type": "application/json"}, timeout)

    def complete(self, prompt, max_tokens=24, **kw):
        """A greedy /v1/completions request (kw overrides); the parsed 200 response."""
        st, _, data = self.post("/v1/completions", {"model": "m", "prompt": prompt,
                                                    "max_tokens": max_tokens,
                                                    "temperature": 0, **kw})
        assert st == 200, data
        return json.loads(data)

    def metrics_text(self):
        st, _, body = self.request("GET", "/metrics", timeout=10)
        assert st == 200
        return body.decode()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signals the server and waits: (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return rc, self.proc.stderr.read()


def module_server(tmp_path_factory, name, *args):
    """A module fixture's body: a server with args, stopped at the end, which must exit 0."""
    s = Server(tmp_path_factory.mktemp(name), *args)
    yield s
    s.stop()
    assert s.proc.returncode == 0, s.proc.stderr.read()
