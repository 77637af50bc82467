package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/internal/testutil"
)

// TestHealth runs `raftlockd health` the way a container health check
// does: exit 0 while the probed endpoint answers 200, 1 otherwise, with the
// reason on stderr. The server's certificate is verified against the CA of
// a bundle found the way the server finds its own.
func TestHealth(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	host := strings.TrimPrefix(srv.url, "https://")
	dataDir := "RAFTLOCKD_DATA_DIR=" + srv.dataDir

	for _, args := range [][]string{
		{"health", "--server", srv.url},
		{"health", "--server", host, "--live"}, // no scheme: https, as a bundle is found
	} {
		res := cli(t, []string{dataDir}, "", args...)
		if res.code != 0 || !strings.Contains(res.stdout, "node node-") || !strings.Contains(res.stdout, "https://") {
			t.Errorf("%v against a ready node: exit %d, stdout %q, stderr %q", args, res.code, res.stdout, res.stderr)
		}
	}
	// Without --server: the address in RAFTLOCKD_LISTEN (the wildcard case
	// is TestDefaultHealthServer's), then the health command's own
	// variable; the bundle from the data dir, RAFTLOCKD_BUNDLE (as a node
	// of a cluster started with a bundle has it) or --bundle.
	serverBundle := filepath.Join(srv.dataDir, "tls", auth.ServerFile)
	for _, env := range [][]string{
		{dataDir, "RAFTLOCKD_LISTEN=" + host},
		{dataDir, "RAFTLOCKD_LISTEN=" + testutil.FreeAddr(t), "RAFTLOCKD_HEALTH_SERVER=" + srv.url},
		{"RAFTLOCKD_LISTEN=" + host, "RAFTLOCKD_BUNDLE=" + serverBundle},
		{"RAFTLOCKD_LISTEN=" + host, "RAFTLOCKD_HEALTH_BUNDLE=" + filepath.Join(srv.dataDir, "tls", auth.CAFile)},
	} {
		if res := cli(t, env, "", "health"); res.code != 0 {
			t.Errorf("health with %v: exit %d, stderr %q", env, res.code, res.stderr)
		}
	}

	// No bundle to verify the server with: a clear refusal, unless asked
	// not to verify; a bundle of another CA does not verify it.
	res := cli(t, []string{"RAFTLOCKD_DATA_DIR=" + t.TempDir()}, "", "health", "--server", srv.url)
	if res.code != 1 || !strings.Contains(res.stderr, "no bundle") || !strings.Contains(res.stderr, "--insecure-skip-verify") ||
		!strings.Contains(res.stderr, auth.ClientFile) || !strings.Contains(res.stderr, auth.TCClientFile) {
		t.Errorf("health without a bundle: exit %d, stderr %q; want the refusal naming every file looked for", res.code, res.stderr)
	}
	// A probe needs a time to wait.
	for _, d := range []string{"0s", "-1s"} {
		if res := cli(t, []string{dataDir}, "", "health", "--server", srv.url, "--timeout", d); res.code != 1 || !strings.Contains(res.stderr, "positive") {
			t.Errorf("health --timeout %s: exit %d, stderr %q; want a refusal", d, res.code, res.stderr)
		}
	}
	// Not verifying, a server without a scheme is probed over https too.
	for _, server := range []string{srv.url, host} {
		res := cli(t, []string{"RAFTLOCKD_DATA_DIR=" + t.TempDir()}, "", "health", "--server", server, "--insecure-skip-verify")
		if res.code != 0 || !strings.HasPrefix(res.stdout, "https://"+host+"/readyz") {
			t.Errorf("health --server %s --insecure-skip-verify: exit %d, stdout %q, stderr %q", server, res.code, res.stdout, res.stderr)
		}
	}
	other := t.TempDir()
	shareCA(t, other)
	res = cli(t, []string{"RAFTLOCKD_DATA_DIR=" + other}, "", "health", "--server", srv.url)
	if res.code != 1 || !strings.Contains(res.stderr, "certificate") {
		t.Errorf("health with a bundle of another CA: exit %d, stderr %q", res.code, res.stderr)
	}

	// Nothing listening: exit 1 with the reason.
	down := testutil.FreeAddr(t)
	res = cli(t, []string{dataDir}, "", "health", "--server", "https://"+down)
	if res.code != 1 || !strings.Contains(res.stderr, "connection refused") {
		t.Errorf("health against %s (nothing listening): exit %d, stderr %q", down, res.code, res.stderr)
	}
	if res := cli(t, []string{dataDir, "RAFTLOCKD_LISTEN=" + down}, "", "health"); res.code != 1 {
		t.Errorf("health with RAFTLOCKD_LISTEN on a closed port: exit %d", res.code)
	}

	// A node waiting for peers that never come is alive but not ready.
	dir, listen := t.TempDir(), testutil.FreeAddr(t)
	shareCA(t, dir)
	lonely := spawnServer(t, listen, append(serverFlags(dir, listen, testutil.FreeAddr(t)), "--bootstrap-expect", "3"), nil)
	testutil.WaitFor(t, 20*time.Second, "the lonely node to serve HTTP", func() bool {
		_, err := lonely.probe(dir, "/healthz")
		return err == nil
	})
	lonelyEnv := []string{"RAFTLOCKD_DATA_DIR=" + dir}
	if res := cli(t, lonelyEnv, "", "health", "--live", "--server", lonely.url); res.code != 0 {
		t.Errorf("--live on a node without a leader: exit %d, stderr %q", res.code, res.stderr)
	}
	res = cli(t, lonelyEnv, "", "health", "--server", lonely.url)
	if res.code != 1 || !strings.Contains(res.stderr, "503") || !strings.Contains(res.stderr, "not_ready") {
		t.Errorf("readiness of a node without a leader: exit %d, stderr %q", res.code, res.stderr)
	}
	// A server that accepts the connection but never answers: the timeout.
	start := time.Now()
	if err := syscall.Kill(lonely.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	res = cli(t, lonelyEnv, "", "health", "--live", "--timeout", "300ms", "--server", lonely.url)
	if res.code != 1 || time.Since(start) > 10*time.Second {
		t.Errorf("health against a stopped process: exit %d after %s, stderr %q", res.code, time.Since(start), res.stderr)
	}
}

// TestDefaultHealthServer: without --server the health check probes the
// address the same environment's server listens on, over loopback when it
// listens on every interface (as in the container image).
func TestDefaultHealthServer(t *testing.T) {
	for listen, want := range map[string]string{
		"":              "https://127.0.0.1:9341",
		"0.0.0.0:9341":  "https://127.0.0.1:9341",
		":7000":         "https://127.0.0.1:7000",
		"[::]:7000":     "https://[::1]:7000",
		"10.1.2.3:9341": "https://10.1.2.3:9341",
		"node1:9341":    "https://node1:9341",
		"127.9.9.9:1":   "https://127.9.9.9:1",
	} {
		t.Setenv("RAFTLOCKD_LISTEN", listen)
		if got := defaultHealthServer("https"); got != want {
			t.Errorf("RAFTLOCKD_LISTEN=%q: %s, want %s", listen, got, want)
		}
	}
	t.Setenv("RAFTLOCKD_LISTEN", "0.0.0.0:9341")
	if got := defaultHealthServer("http"); got != "http://127.0.0.1:9341" {
		t.Errorf("without TLS: %s", got)
	}
}
