package main

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/internal/testutil"
)

// TestHealth runs `raftlockd health` the way a container health check
// does: exit 0 while the probed endpoint answers 200, 1 otherwise, with the
// reason on stderr.
func TestHealth(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	host := strings.TrimPrefix(srv.url, "http://")

	for _, args := range [][]string{
		{"health", "--server", srv.url},
		{"health", "--server", host, "--live"},
	} {
		res := cli(t, nil, "", args...)
		if res.code != 0 || !strings.Contains(res.stdout, "node node-") {
			t.Errorf("%v against a ready node: exit %d, stdout %q, stderr %q", args, res.code, res.stdout, res.stderr)
		}
	}
	// Without --server: the address in RAFTLOCKD_LISTEN (the wildcard case
	// is TestDefaultHealthServer's), then the health command's own variable.
	for _, env := range [][]string{
		{"RAFTLOCKD_LISTEN=" + host},
		{"RAFTLOCKD_LISTEN=" + testutil.FreeAddr(t), "RAFTLOCKD_HEALTH_SERVER=" + srv.url},
	} {
		if res := cli(t, env, "", "health"); res.code != 0 {
			t.Errorf("health with %v: exit %d, stderr %q", env, res.code, res.stderr)
		}
	}

	// Nothing listening: exit 1 with the reason.
	down := testutil.FreeAddr(t)
	res := cli(t, nil, "", "health", "--server", "http://"+down)
	if res.code != 1 || !strings.Contains(res.stderr, "connection refused") {
		t.Errorf("health against %s (nothing listening): exit %d, stderr %q", down, res.code, res.stderr)
	}
	if res := cli(t, []string{"RAFTLOCKD_LISTEN=" + down}, "", "health"); res.code != 1 {
		t.Errorf("health with RAFTLOCKD_LISTEN on a closed port: exit %d", res.code)
	}

	// A node waiting for peers that never come is alive but not ready.
	dir, listen := t.TempDir(), testutil.FreeAddr(t)
	lonely := spawnServer(t, listen, append(serverFlags(dir, listen, testutil.FreeAddr(t)), "--bootstrap-expect", "3"), nil)
	testutil.WaitFor(t, 20*time.Second, "the lonely node to serve HTTP", func() bool {
		resp, err := http.Get(lonely.url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if res := cli(t, nil, "", "health", "--live", "--server", lonely.url); res.code != 0 {
		t.Errorf("--live on a node without a leader: exit %d, stderr %q", res.code, res.stderr)
	}
	res = cli(t, nil, "", "health", "--server", lonely.url)
	if res.code != 1 || !strings.Contains(res.stderr, "503") || !strings.Contains(res.stderr, "not_ready") {
		t.Errorf("readiness of a node without a leader: exit %d, stderr %q", res.code, res.stderr)
	}
	// A server that accepts the connection but never answers: the timeout.
	start := time.Now()
	if err := syscall.Kill(lonely.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	res = cli(t, nil, "", "health", "--live", "--timeout", "300ms", "--server", lonely.url)
	if res.code != 1 || time.Since(start) > 10*time.Second {
		t.Errorf("health against a stopped process: exit %d after %s, stderr %q", res.code, time.Since(start), res.stderr)
	}
}

// TestDefaultHealthServer: without --server the health check probes the
// address the same environment's server listens on, over loopback when it
// listens on every interface (as in the container image).
func TestDefaultHealthServer(t *testing.T) {
	for listen, want := range map[string]string{
		"":              "http://127.0.0.1:9341",
		"0.0.0.0:9341":  "http://127.0.0.1:9341",
		":7000":         "http://127.0.0.1:7000",
		"[::]:7000":     "http://[::1]:7000",
		"10.1.2.3:9341": "http://10.1.2.3:9341",
		"node1:9341":    "http://node1:9341",
		"127.9.9.9:1":   "http://127.9.9.9:1",
	} {
		t.Setenv("RAFTLOCKD_LISTEN", listen)
		if got := defaultHealthServer(); got != want {
			t.Errorf("RAFTLOCKD_LISTEN=%q: %s, want %s", listen, got, want)
		}
	}
}
