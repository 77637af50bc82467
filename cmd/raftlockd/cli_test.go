package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/internal/lockedbuf"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// These tests drive the real binary: `raftlockd server` runs as a child
// process and `raftlockd client ...` is invoked directly or from bash, the
// way an operator would. Servers serve mutual TLS unless a test is about
// plain HTTP; the commands find the bundles in the server's data directory
// through RAFTLOCKD_DATA_DIR, as they would on the server's machine.

// dataHome stands in for XDG_DATA_HOME in every child process (see
// TestMain): an empty directory, so that no command finds the bundles of
// a server this machine's user runs in the default data directory.
var dataHome string

// baseEnv is the test process's environment without any RAFTLOCKD_
// variable, with the binary's directory first on PATH and XDG_DATA_HOME
// set to dataHome, plus extra (which wins).
func baseEnv(t testing.TB, extra ...string) []string {
	t.Helper()
	bin := testutil.Binary(t)
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "RAFTLOCKD_") || strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "XDG_DATA_HOME=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"), "XDG_DATA_HOME="+dataHome)
	return append(env, extra...)
}

// serverProc is one running `raftlockd server` process.
type serverProc struct {
	t       testing.TB
	cmd     *exec.Cmd
	url     string // https://listen, or http:// with mTLS disabled
	log     *lockedbuf.Buffer
	done    chan struct{} // closed once the process has exited
	waitErr error
	nodeID  string // the node id it is started with; "" when it keeps one in its data dir
	dataDir string // its --data-dir or RAFTLOCKD_DATA_DIR; "" for the default one
	bundle  string // its --bundle or RAFTLOCKD_BUNDLE; "" for <data dir>/tls/server.pem
}

// flagValue is the value of a server flag that takes one, as a server
// started with args and env sees it: the flag's last occurrence, else its
// environment variable.
func flagValue(args, env []string, flag string) string {
	val, found := "", false
	for i, a := range args {
		if a == "--"+flag && i+1 < len(args) {
			val, found = args[i+1], true
		} else if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			val, found = v, true
		}
	}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, envName("RAFTLOCKD_", flag)+"="); ok && !found {
			val = v
		}
	}
	return val
}

// mtlsDisabled reports whether a server started with args and env serves
// plain HTTP.
func mtlsDisabled(args, env []string) bool {
	off, _ := strconv.ParseBool(flagValue(args, env, "disable-mtls"))
	return off || slices.Contains(args, "--disable-mtls")
}

// serverFlags are the flags of a fast-starting node in dataDir.
func serverFlags(dataDir, listen, raftListen string) []string {
	return []string{"--data-dir", dataDir, "--listen", listen, "--raft-listen", raftListen,
		"--gossip-listen", "127.0.0.1:0", "--gossip-profile", "fast",
		"--raft-heartbeat-timeout", "200ms", "--raft-election-timeout", "200ms"}
}

// spawnServer starts `raftlockd server args...` with env added to the base
// environment and kills it when the test ends. It does not wait for it.
func spawnServer(t testing.TB, listen string, args, env []string) *serverProc {
	t.Helper()
	p := &serverProc{t: t, url: "https://" + listen, log: &lockedbuf.Buffer{}, done: make(chan struct{}),
		dataDir: flagValue(args, env, "data-dir"), bundle: flagValue(args, env, "bundle")}
	if mtlsDisabled(args, env) {
		p.url = "http://" + listen
	}
	p.cmd = exec.Command(testutil.Binary(t), append([]string{"server"}, args...)...)
	p.cmd.Env = baseEnv(t, env...)
	p.cmd.Stdout = p.log
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start server: %v", err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("server %s (pid %d) output:\n%s", p.url, p.cmd.Process.Pid, p.log.String())
		}
	})
	return p
}

// startServer starts a server and waits until it is ready.
func startServer(t testing.TB, dataDir, listen string, args, env []string) *serverProc {
	t.Helper()
	p := spawnServer(t, listen, args, env)
	if err := p.waitReady(dataDir, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	return p
}

// newServer starts a fast node on fresh ports in a fresh data dir.
func newServer(t testing.TB) *serverProc {
	t.Helper()
	dir, listen := t.TempDir(), testutil.FreeAddr(t)
	return startServer(t, dir, listen, serverFlags(dir, listen, testutil.FreeAddr(t)), nil)
}

func (p *serverProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitReady polls GET /readyz until it answers 200 from this process (the
// node id it reports is the one kept in dataDir), the process exits or the
// timeout passes.
func (p *serverProc) waitReady(dataDir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if p.exited() {
			return fmt.Errorf("server %s exited before it was ready (%v); output:\n%s", p.url, p.waitErr, p.log.String())
		}
		if served, err := p.probe(dataDir, "/readyz"); err == nil {
			id := []byte(p.nodeID)
			if p.nodeID == "" {
				id, _ = os.ReadFile(filepath.Join(dataDir, "node-id"))
			}
			if served == strings.TrimSpace(string(id)) {
				return nil
			} else if served != "" && len(id) > 0 {
				return fmt.Errorf("%s is served by node %q, not by the node in %s (%q)", p.url, served, dataDir, id)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("server %s not ready after %s; output:\n%s", p.url, timeout, p.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// probe GETs path (a probe) and returns the node that answered 200.
func (p *serverProc) probe(dataDir, path string) (servedBy string, err error) {
	hc := p.probeClient(dataDir)
	if hc == nil {
		return "", errors.New("the server has not written its bundle yet")
	}
	resp, err := hc.Get(p.url + path)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return resp.Header.Get(wire.HeaderServedBy), nil
}

// probeClient is an HTTP client for the node's open endpoints (probes),
// which checks the server against the CA of its bundle (from its data dir
// when it was given none); nil while that bundle does not exist yet.
func (p *serverProc) probeClient(dataDir string) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	if strings.HasPrefix(p.url, "https://") {
		path := p.bundle
		if path == "" {
			path = filepath.Join(dataDir, "tls", auth.ServerFile)
		}
		b, err := auth.LoadBundle(path)
		if err != nil {
			return nil
		}
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: b.Roots()}
	}
	return &http.Client{Timeout: time.Second, Transport: tr}
}

// clientTLS is the TLS configuration of the client bundle in the node's
// data dir, for SDK clients; nil with mTLS disabled.
func (p *serverProc) clientTLS() *tls.Config {
	p.t.Helper()
	if !strings.HasPrefix(p.url, "https://") {
		return nil
	}
	b, err := auth.LoadBundle(filepath.Join(p.dataDir, "tls", auth.ClientFile))
	if err != nil {
		p.t.Fatal(err)
	}
	return auth.ClientConfig(b)
}

// kill SIGKILLs the process (if it still runs) and waits for it to exit.
func (p *serverProc) kill() {
	if !p.exited() {
		_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Errorf("server pid %d did not exit after SIGKILL", p.cmd.Process.Pid)
	}
}

// stop SIGTERMs the process and requires a clean exit.
func (p *serverProc) stop() {
	p.t.Helper()
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		p.t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.t.Fatalf("server pid %d did not exit within 20s of SIGTERM", p.cmd.Process.Pid)
	}
	if p.waitErr != nil {
		p.t.Fatalf("server exited with %v after SIGTERM; output:\n%s", p.waitErr, p.log.String())
	}
}

// clientEnv points client commands at the server and, through
// RAFTLOCKD_DATA_DIR, at the bundles in its data dir.
func (p *serverProc) clientEnv(extra ...string) []string {
	env := []string{"RAFTLOCKD_CLIENT_SERVER=" + p.url}
	if p.dataDir != "" {
		env = append(env, "RAFTLOCKD_DATA_DIR="+p.dataDir)
	}
	return append(env, extra...)
}

// loopbackHost is the loopback address testutil.FreeAddr hands out
// addresses on (one per test process).
func loopbackHost(t testing.TB) string {
	t.Helper()
	host, _, err := net.SplitHostPort(testutil.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return host
}

// shareCA gives every data dir the bundles of one new CA, where the
// single-node default would create bundles of its own: tls/server.pem
// (valid for the loopback addresses, loopbackHost's among them),
// tls/client.pem (every namespace) and tls/tcclient.pem. Nodes started on those data dirs can form one cluster,
// and commands find the bundles through RAFTLOCKD_DATA_DIR.
func shareCA(t testing.TB, dataDirs ...string) *auth.Bundle {
	t.Helper()
	ca, err := auth.NewCA(auth.IssueOptions{Name: "test cluster CA"})
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range dataDirs {
		tlsDir := filepath.Join(dir, "tls")
		testutil.ServerBundle(t, tlsDir, ca, loopbackHost(t))
		for file, b := range map[string]*auth.Bundle{
			auth.ClientFile:   testutil.Issue(t, ca, auth.RoleClient, auth.IssueOptions{Perms: []auth.Perm{{Namespace: "*", Write: true}}}),
			auth.TCClientFile: testutil.Issue(t, ca, auth.RoleTCClient, auth.IssueOptions{}),
		} {
			if err := b.WriteFile(filepath.Join(tlsDir, file)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ca
}

type cliResult struct {
	stdout, stderr string
	code           int
}

// run executes name args... with env added to the base environment.
func run(t testing.TB, env []string, stdin string, name string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = baseEnv(t, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := cliResult{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && ctx.Err() == nil:
		res.code = exit.ExitCode()
	default:
		t.Fatalf("%s %s: %v (stderr %q)", name, strings.Join(args, " "), err, res.stderr)
	}
	return res
}

// cli runs the binary and returns its result, whatever the exit status.
func cli(t testing.TB, env []string, stdin string, args ...string) cliResult {
	t.Helper()
	return run(t, env, stdin, testutil.Binary(t), args...)
}

// mustCLI runs the binary and fails the test unless it succeeds.
func mustCLI(t testing.TB, env []string, stdin string, args ...string) string {
	t.Helper()
	res := cli(t, env, stdin, args...)
	if res.code != 0 {
		t.Fatalf("raftlockd %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

// bash runs script under `bash -c` with errexit, nounset and pipefail, and
// fails the test unless it succeeds.
func bash(t testing.TB, env []string, script string) string {
	t.Helper()
	sh, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash not available")
	}
	res := run(t, env, "", sh, "-c", "set -euo pipefail\n"+script)
	if res.code != 0 {
		t.Fatalf("bash script: exit %d\nscript:\n%s\nstdout: %s\nstderr: %s", res.code, script, res.stdout, res.stderr)
	}
	return res.stdout
}

// parseExports reads the `export NAME='value'` lines acquire prints.
func parseExports(t testing.TB, out string) map[string]string {
	t.Helper()
	vars := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		name, val, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok || !strings.HasPrefix(line, "export ") {
			t.Fatalf("not an export line: %q (output %q)", line, out)
		}
		if strings.HasPrefix(val, "'") {
			if !strings.HasSuffix(val, "'") || len(val) < 2 {
				t.Fatalf("badly quoted export: %q", line)
			}
			val = strings.ReplaceAll(val[1:len(val)-1], `'\''`, `'`)
		}
		vars[name] = val
	}
	return vars
}

// envList turns exported variables into NAME=value entries.
func envList(vars map[string]string) []string {
	var env []string
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}

// parseLines reads NAME=value lines printed by a test script.
func parseLines(out string) map[string]string {
	vals := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			vals[k] = v
		}
	}
	return vals
}

// wantJSON checks that got holds the same JSON document as want.
func wantJSON(t testing.TB, what, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("%s: %q is not JSON: %v", what, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: bad expectation %q: %v", what, want, err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if !bytes.Equal(gb, wb) {
		t.Fatalf("%s: got %s, want %s", what, got, want)
	}
}

// wantEmpty checks that a read printed nothing (the key has no state).
func wantEmpty(t testing.TB, what, got string) {
	t.Helper()
	if strings.TrimSpace(got) != "" {
		t.Fatalf("%s: got %q, want no document", what, got)
	}
}

// wantExpiry checks an expires-at value is about ttl from now.
func wantExpiry(t testing.TB, what, got string, ttl time.Duration) {
	t.Helper()
	n, err := strconv.ParseInt(got, 10, 64)
	if err != nil {
		t.Fatalf("%s: %q is not a unix time", what, got)
	}
	want := time.Now().Add(ttl).Unix()
	if n < want-5 || n > want+5 {
		t.Fatalf("%s = %d, want about %d (now + %s)", what, n, want, ttl)
	}
}

func describe(t testing.TB, env []string, key string) wire.DescribeResponse {
	t.Helper()
	out := mustCLI(t, env, "", "client", "describe", "--key", key)
	var d wire.DescribeResponse
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("describe output %q: %v", out, err)
	}
	return d
}

func TestParseSeconds(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "30": 30, "-1": -1, "30s": 30, "1m": 60, "1.4s": 2, "1.5s": 2,
		"2400ms": 3, "300ms": 1, "1ns": 1, "0s": 0, "-1s": -1, "-500ms": -1, "-2s": -2} {
		for _, wait := range []bool{false, true} {
			if got, err := parseSeconds(in, wait); err != nil || got != want {
				t.Errorf("parseSeconds(%q, %t) = %d, %v; want %d", in, wait, got, err, want)
			}
		}
	}
	// The words are for the wait flags only; the other flags do not
	// mention them.
	for in, want := range map[string]int64{"nowait": -1, "forever": 0} {
		if got, err := parseSeconds(in, true); err != nil || got != want {
			t.Errorf("parseSeconds(%q, true) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"nowait", "forever", "soon"} {
		if _, err := parseSeconds(in, false); err == nil || strings.Contains(err.Error(), "nowait nor forever") {
			t.Errorf("parseSeconds(%q, false): %v; want an error that does not offer nowait or forever", in, err)
		}
	}
	if _, err := parseSeconds("soon", true); err == nil || !strings.Contains(err.Error(), "nowait nor forever") {
		t.Errorf("parseSeconds(soon, true): %v; want an error offering nowait and forever", err)
	}
}

// TestCLIWaitWordsOnlyForWaitFlags: nowait and forever are what --block and
// --wait take; every other duration flag refuses them, naming itself (or
// its variable), and nothing is sent.
func TestCLIWaitWordsOnlyForWaitFlags(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	lease := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "w", "--block", "nowait"))
	env := srv.clientEnv(envList(lease)...)
	for _, word := range []string{"forever", "nowait"} {
		for _, c := range [][]string{
			{"client", "acquire", "--key", "other", "--ttl"},
			{"client", "keepalive", "--ttl"},
			{"client", "queue", "enqueue", "--queue", "fq", "--delay"},
			{"client", "queue", "enqueue", "--queue", "fq", "--visibility"},
			{"client", "queue", "enqueue", "--queue", "fq", "--message-ttl"},
			{"client", "queue", "dequeue", "--queue", "fq", "--visibility"},
			{"client", "queue", "nack", "--delay"},
			{"client", "queue", "extend", "--by"},
		} {
			flag := c[len(c)-1]
			res := cli(t, env, "payload", append(slices.Clone(c), word)...)
			if res.code != 1 || !strings.Contains(res.stderr, fmt.Sprintf("%q for %q flag", word, flag)) ||
				strings.Contains(res.stderr, "nowait nor forever") || res.stdout != "" {
				t.Errorf("%s %s: exit %d, stdout %q, stderr %q; want a refusal naming %s", strings.Join(c, " "), word,
					res.code, res.stdout, res.stderr, flag)
			}
		}
	}
	res := cli(t, srv.clientEnv("RAFTLOCKD_CLIENT_TTL=forever"), "", "client", "acquire", "--key", "other")
	if res.code != 1 || !strings.Contains(res.stderr, "RAFTLOCKD_CLIENT_TTL") {
		t.Errorf("RAFTLOCKD_CLIENT_TTL=forever: exit %d, stderr %q; want a refusal naming the variable", res.code, res.stderr)
	}
	// Nothing was enqueued, and nothing else was acquired; the wait flags
	// take the words.
	res = cli(t, srv.clientEnv(), "", "client", "queue", "dequeue", "--queue", "fq", "--wait", "nowait")
	if res.code != 1 || !strings.Contains(res.stderr, "waiting") {
		t.Errorf("dequeue --wait nowait of a queue nothing was enqueued to: exit %d, stderr %q", res.code, res.stderr)
	}
	if d := describe(t, srv.clientEnv(), "other"); d.LeaseID != "" {
		t.Errorf("a refused acquire took the key: %+v", d)
	}
	other := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "other", "--block", "forever"))
	mustCLI(t, srv.clientEnv(envList(other)...), "", "client", "release")
	mustCLI(t, env, "", "client", "release")
}

func TestVersion(t *testing.T) {
	t.Parallel()
	out := mustCLI(t, nil, "", "version")
	if !strings.HasPrefix(out, "raftlockd") {
		t.Fatalf("version printed %q, want it to start with raftlockd", out)
	}
}

// TestCLIEvalAcquire is the documented shell workflow: acquire exports the
// lease and every later command in the script picks it up from there.
func TestCLIEvalAcquire(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	out := bash(t, srv.clientEnv(), `
eval "$(raftlockd client acquire --key k --ttl 30s)"
for v in NAMESPACE KEY LEASE TXN_ID FENCING_TOKEN EXPIRES_AT; do
  n="RAFTLOCKD_CLIENT_$v"; echo "$v=${!n}"
done
echo '{"step":1,"name":"first"}' | raftlockd client update >/dev/null
echo "HOLDER=$(raftlockd client get)"
echo "PUBLIC_BEFORE=$(raftlockd client get --public)"
echo "OTHER=$(raftlockd client get --key other 2>&1)"
eval "$(raftlockd client release)"
echo "PUBLIC_AFTER=$(raftlockd client get --public)"
echo "NO_LEASE=$(raftlockd client get)"
echo "CLEARED=${RAFTLOCKD_CLIENT_LEASE:-none}/${RAFTLOCKD_CLIENT_TXN_ID:-none}"
eval "$(raftlockd client acquire --key k --ttl 30s)"
echo "NEXT_TOKEN=$RAFTLOCKD_CLIENT_FENCING_TOKEN"
echo "NEXT_TXN=$RAFTLOCKD_CLIENT_TXN_ID"
eval "$(raftlockd client release)"
`)
	v := parseLines(out)
	for name, want := range map[string]string{"NAMESPACE": "default", "KEY": "k", "FENCING_TOKEN": "1"} {
		if v[name] != want {
			t.Errorf("RAFTLOCKD_CLIENT_%s = %q, want %q (output %q)", name, v[name], want, out)
		}
	}
	if v["LEASE"] == "" || v["TXN_ID"] == "" || v["LEASE"] == v["TXN_ID"] {
		t.Errorf("lease %q and txn %q: want two distinct non-empty ids", v["LEASE"], v["TXN_ID"])
	}
	wantExpiry(t, "RAFTLOCKD_CLIENT_EXPIRES_AT", v["EXPIRES_AT"], 30*time.Second)
	wantJSON(t, "holder's view", v["HOLDER"], `{"step":1,"name":"first"}`)
	wantEmpty(t, "public view before release", v["PUBLIC_BEFORE"])
	wantEmpty(t, "another key while holding k (a public read, not k's lease)", v["OTHER"])
	wantJSON(t, "public view after release", v["PUBLIC_AFTER"], `{"step":1,"name":"first"}`)
	wantJSON(t, "get without a lease", v["NO_LEASE"], `{"step":1,"name":"first"}`)
	// eval of release's output ends the transaction in the shell, so the
	// next acquire starts a new one instead of joining the committed one.
	if v["CLEARED"] != "none/none" {
		t.Errorf("release left lease variables set: %q", v["CLEARED"])
	}
	if v["NEXT_TOKEN"] != "2" || v["NEXT_TXN"] == "" || v["NEXT_TXN"] == v["TXN_ID"] {
		t.Errorf("acquire after release: token %q txn %q (first txn %q)", v["NEXT_TOKEN"], v["NEXT_TXN"], v["TXN_ID"])
	}
	if d := describe(t, srv.clientEnv(), "k"); d.Version != 1 || d.LeaseID != "" {
		t.Fatalf("after release: %+v, want version 1 and no holder", d)
	}
}

// TestCLIUpdateSources stages documents from a file, from `-` and from
// stdin without an argument; only the holder sees them until release.
func TestCLIUpdateSources(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	lease := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "doc", "--ttl", "30s"))
	env := srv.clientEnv(envList(lease)...)

	file := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(file, []byte(`{"src":"file","n":[1,2,3]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name, stdin, want string
		args              []string
	}{
		{"file", "", `{"src":"file","n":[1,2,3]}`, []string{file}},
		{"dash", `{"src":"dash"}`, `{"src":"dash"}`, []string{"-"}},
		{"stdin", `{"src":"stdin","nested":{"ok":true}}`, `{"src":"stdin","nested":{"ok":true}}`, nil},
	}
	for _, s := range steps {
		out := mustCLI(t, env, s.stdin, append([]string{"client", "update"}, s.args...)...)
		var up wire.UpdateResponse
		if err := json.Unmarshal([]byte(out), &up); err != nil || up.Bytes <= 0 {
			t.Fatalf("update from %s printed %q (%v), want an update response", s.name, out, err)
		}
		wantJSON(t, "holder after update from "+s.name, mustCLI(t, env, "", "client", "get"), s.want)
		wantEmpty(t, "public view after update from "+s.name, mustCLI(t, env, "", "client", "get", "--public"))
	}
	mustCLI(t, env, "", "client", "release")
	wantJSON(t, "public view after release", mustCLI(t, srv.clientEnv(), "", "client", "get", "--key", "doc"), steps[2].want)

	// A file that does not exist is an error, and nothing is sent.
	res := cli(t, env, "", "client", "update", filepath.Join(t.TempDir(), "missing.json"))
	if res.code == 0 || !strings.Contains(res.stderr, "missing.json") {
		t.Fatalf("update from a missing file: exit %d, stderr %q", res.code, res.stderr)
	}
}

// TestCLIReleaseRollback checks that --rollback discards what was staged.
func TestCLIReleaseRollback(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	out := bash(t, srv.clientEnv(), `
eval "$(raftlockd client acquire --key rb)"
echo '{"v":1}' | raftlockd client update >/dev/null
raftlockd client release >/dev/null
# The committed transaction cannot be joined: the next acquire needs a new one.
if raftlockd client acquire --key rb 2>/dev/null; then echo "JOINED_COMMITTED=yes"; fi
unset RAFTLOCKD_CLIENT_TXN_ID
out=$(raftlockd client acquire --key rb)
eval "$out"
echo "TOKEN2=$RAFTLOCKD_CLIENT_FENCING_TOKEN"
echo '{"v":2}' | raftlockd client update >/dev/null
echo "HOLDER=$(raftlockd client get)"
raftlockd client release --rollback >/dev/null
echo "PUBLIC=$(raftlockd client get --public)"
unset RAFTLOCKD_CLIENT_TXN_ID RAFTLOCKD_CLIENT_LEASE RAFTLOCKD_CLIENT_FENCING_TOKEN
out=$(raftlockd client acquire --key rb --block=-1)
eval "$out"
echo "TOKEN3=$RAFTLOCKD_CLIENT_FENCING_TOKEN"
echo "HOLDER3=$(raftlockd client get)"
raftlockd client release --rollback >/dev/null
`)
	v := parseLines(out)
	if v["JOINED_COMMITTED"] != "" {
		t.Errorf("acquire joined a committed transaction")
	}
	if v["TOKEN2"] != "2" || v["TOKEN3"] != "3" {
		t.Errorf("fencing tokens %q, %q: want 2, 3", v["TOKEN2"], v["TOKEN3"])
	}
	wantJSON(t, "holder before rollback", v["HOLDER"], `{"v":2}`)
	wantJSON(t, "public view after rollback", v["PUBLIC"], `{"v":1}`)
	wantJSON(t, "holder after rollback", v["HOLDER3"], `{"v":1}`)
	if d := describe(t, srv.clientEnv(), "rb"); d.Version != 1 || d.LeaseID != "" {
		t.Fatalf("after rollback: %+v, want version 1 and no holder", d)
	}
}

// A release refused because a lease of the transaction expired
// (txn_rolled_back) fails, but still prints the unset line: the transaction
// is over for good, and eval of the output leaves a shell whose next
// acquire starts a new one rather than failing on the rolled-back one.
func TestCLIReleaseOfAnExpiredLeaseClearsTheShell(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	lease := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "exp", "--ttl", "1s"))
	env := srv.clientEnv(envList(lease)...)
	testutil.WaitFor(t, 15*time.Second, "the lease to expire", func() bool {
		return describe(t, srv.clientEnv(), "exp").LeaseID == ""
	})
	res := cli(t, env, "", "client", "release")
	want := "unset RAFTLOCKD_CLIENT_LEASE RAFTLOCKD_CLIENT_TXN_ID RAFTLOCKD_CLIENT_FENCING_TOKEN RAFTLOCKD_CLIENT_EXPIRES_AT RAFTLOCKD_CLIENT_VERSION\n"
	if res.code != 1 || !strings.Contains(res.stderr, "txn_rolled_back") || res.stdout != want {
		t.Fatalf("release of an expired lease: exit %d, stdout %q, stderr %q; want exit 1, txn_rolled_back and %q",
			res.code, res.stdout, res.stderr, want)
	}
	out := bash(t, env, `
eval "$(raftlockd client release 2>/dev/null)"
echo "CLEARED=${RAFTLOCKD_CLIENT_LEASE:-none}/${RAFTLOCKD_CLIENT_TXN_ID:-none}"
eval "$(raftlockd client acquire --key exp)"
echo "TXN=$RAFTLOCKD_CLIENT_TXN_ID"
eval "$(raftlockd client release)"
`)
	v := parseLines(out)
	if v["CLEARED"] != "none/none" || v["TXN"] == "" || v["TXN"] == lease["RAFTLOCKD_CLIENT_TXN_ID"] {
		t.Fatalf("after eval of the failed release: %q, then a new transaction %q (the rolled-back one %s)",
			v["CLEARED"], v["TXN"], lease["RAFTLOCKD_CLIENT_TXN_ID"])
	}
}

// TestCLIJoinTransaction acquires a second key inside the first key's
// transaction; releasing one lease commits both keys.
func TestCLIJoinTransaction(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	out := bash(t, srv.clientEnv(), `
eval "$(raftlockd client acquire --key a)"
A_LEASE=$RAFTLOCKD_CLIENT_LEASE A_TOKEN=$RAFTLOCKD_CLIENT_FENCING_TOKEN A_TXN=$RAFTLOCKD_CLIENT_TXN_ID
eval "$(raftlockd client acquire --key b)"
echo "A_TXN=$A_TXN"
echo "B_TXN=$RAFTLOCKD_CLIENT_TXN_ID"
echo "B_KEY=$RAFTLOCKD_CLIENT_KEY"
echo '{"key":"b"}' | raftlockd client update >/dev/null
echo '{"key":"a"}' | raftlockd client update --key a --lease "$A_LEASE" --fencing-token "$A_TOKEN" >/dev/null
echo "A_BEFORE=$(raftlockd client get --public --key a)"
echo "B_BEFORE=$(raftlockd client get --public)"
raftlockd client release --key a --lease "$A_LEASE" --fencing-token "$A_TOKEN" >/dev/null
echo "A_AFTER=$(raftlockd client get --public --key a)"
echo "B_AFTER=$(raftlockd client get --public)"
`)
	v := parseLines(out)
	if v["A_TXN"] == "" || v["A_TXN"] != v["B_TXN"] || v["B_KEY"] != "b" {
		t.Fatalf("b did not join a's transaction: %q", out)
	}
	wantEmpty(t, "a before release", v["A_BEFORE"])
	wantEmpty(t, "b before release", v["B_BEFORE"])
	wantJSON(t, "a after release", v["A_AFTER"], `{"key":"a"}`)
	wantJSON(t, "b after release", v["B_AFTER"], `{"key":"b"}`)
	for _, key := range []string{"a", "b"} {
		if d := describe(t, srv.clientEnv(), key); d.Version != 1 || d.LeaseID != "" {
			t.Errorf("%s after release: %+v, want version 1 and no holder", key, d)
		}
	}
}

// TestCLIKeepAliveDescribe extends a lease and reads the key's metadata.
func TestCLIKeepAliveDescribe(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	lease := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "ka", "--ttl", "10s"))
	wantExpiry(t, "acquire expiry", lease["RAFTLOCKD_CLIENT_EXPIRES_AT"], 10*time.Second)
	env := srv.clientEnv(envList(lease)...)

	out := mustCLI(t, env, "", "client", "keepalive", "--ttl", "2m")
	if !regexp.MustCompile(`^export RAFTLOCKD_CLIENT_EXPIRES_AT='[0-9]+'\n$`).MatchString(out) {
		t.Fatalf("keepalive printed %q, want one quoted export as acquire prints", out)
	}
	ka := parseExports(t, out)
	if len(ka) != 1 {
		t.Fatalf("keepalive exported %v, want only RAFTLOCKD_CLIENT_EXPIRES_AT", ka)
	}
	wantExpiry(t, "keepalive expiry", ka["RAFTLOCKD_CLIENT_EXPIRES_AT"], 2*time.Minute)

	d := describe(t, srv.clientEnv(), "ka")
	if d.Key != "ka" || d.Namespace != "default" || d.Version != 0 || d.LeaseID != lease["RAFTLOCKD_CLIENT_LEASE"] ||
		d.FencingToken != 1 || strconv.FormatInt(d.ExpiresAt, 10) != ka["RAFTLOCKD_CLIENT_EXPIRES_AT"] {
		t.Fatalf("describe while held: %+v, lease %v, keepalive %v", d, lease, ka)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, srv.clientEnv(), "", "client", "describe", "--key", "ka")), &raw); err != nil {
		t.Fatal(err)
	}
	if raw["key"] != "ka" || raw["version"] != float64(0) {
		t.Fatalf("describe JSON %v: want key and version fields", raw)
	}

	mustCLI(t, env, `{"x":1}`, "client", "update")
	mustCLI(t, env, "", "client", "release")
	if d := describe(t, srv.clientEnv(), "ka"); d.Version != 1 || d.LeaseID != "" || d.StateETag == "" {
		t.Fatalf("describe after release: %+v, want version 1, an etag and no holder", d)
	}
	// A key that was never used is described as lockd does: version 0.
	if d := describe(t, srv.clientEnv(), "never-used"); d.Key != "never-used" || d.Version != 0 || d.LeaseID != "" {
		t.Fatalf("describe of an unused key: %+v", d)
	}
}

// TestCLIRemoveConditions stages a removal only when --if-version and
// --if-etag match the holder's view, as update does.
func TestCLIRemoveConditions(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	first := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "rmc"))
	var up wire.UpdateResponse
	if err := json.Unmarshal([]byte(mustCLI(t, srv.clientEnv(envList(first)...), `{"v":1}`, "client", "update")), &up); err != nil {
		t.Fatal(err)
	}
	mustCLI(t, srv.clientEnv(envList(first)...), "", "client", "release")
	env := srv.clientEnv(envList(parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "rmc")))...)
	// A refusal names the version and ETag its condition was compared with.
	current := "current version 1, current ETag " + up.NewStateETag
	for _, c := range []struct {
		args []string
		code string
	}{
		{[]string{"--if-version", "0"}, "version_conflict"},
		{[]string{"--if-etag", strings.Repeat("0", 64)}, "etag_mismatch"},
		{[]string{"--if-version", "1", "--if-etag", strings.Repeat("0", 64)}, "etag_mismatch"},
	} {
		res := cli(t, env, "", append([]string{"client", "remove"}, c.args...)...)
		if res.code == 0 || !strings.Contains(res.stderr, c.code) || !strings.Contains(res.stderr, current) {
			t.Fatalf("remove %v: exit %d, stdout %q, stderr %q; want %s and %q", c.args, res.code, res.stdout, res.stderr, c.code, current)
		}
	}
	wantJSON(t, "holder's view after refused removals", mustCLI(t, env, "", "client", "get"), `{"v":1}`)
	out := mustCLI(t, env, "", "client", "remove", "--if-version", "1", "--if-etag", up.NewStateETag)
	var rm wire.RemoveResponse
	if err := json.Unmarshal([]byte(out), &rm); err != nil || !rm.Removed || rm.NewVersion != 2 {
		t.Fatalf("conditional remove printed %q (%v), want removed at version 2", out, err)
	}
	mustCLI(t, env, "", "client", "release")
	wantEmpty(t, "public view after the removal", mustCLI(t, srv.clientEnv(), "", "client", "get", "--key", "rmc"))
}

// TestCLIErrors checks that failures exit non-zero, print nothing to stdout
// (so `eval` does nothing) and name the stable error code on stderr.
func TestCLIErrors(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	lease := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "held"))
	env := srv.clientEnv(envList(lease)...)
	done := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "done"))
	mustCLI(t, srv.clientEnv(envList(done)...), "", "client", "release")

	cases := []struct {
		name  string
		env   []string
		stdin string
		args  []string
		code  string
	}{
		{"wrong fencing token", env, `{"a":1}`, []string{"client", "update", "--fencing-token", "99"}, "fencing_mismatch"},
		{"held key without waiting", srv.clientEnv(), "", []string{"client", "acquire", "--key", "held", "--block=-1"}, "waiting"},
		{"bad lease", env, "", []string{"client", "release", "--lease", "not-a-lease"}, "invalid_lease"},
		{"not JSON", env, "not json", []string{"client", "update"}, "invalid_body"},
		{"join a finished transaction", srv.clientEnv("RAFTLOCKD_CLIENT_TXN_ID=" + done["RAFTLOCKD_CLIENT_TXN_ID"]), "",
			[]string{"client", "acquire", "--key", "other"}, "txn_committed"},
	}
	for _, c := range cases {
		res := cli(t, c.env, c.stdin, c.args...)
		if res.code == 0 || !strings.Contains(res.stderr, c.code) || res.stdout != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want non-zero, no output and %q on stderr",
				c.name, res.code, res.stdout, res.stderr, c.code)
		}
	}
	// A sub-second block is a short wait, not the server's maximum (60s,
	// longer than the holder's 30s TTL).
	start := time.Now()
	res := cli(t, srv.clientEnv(), "", "client", "acquire", "--key", "held", "--block", "300ms", "--timeout", "10s")
	if res.code == 0 || !strings.Contains(res.stderr, "waiting") || time.Since(start) > 8*time.Second {
		t.Errorf("--block 300ms on a held key: exit %d after %s, stderr %q; want waiting after about 1s",
			res.code, time.Since(start).Round(time.Millisecond), res.stderr)
	}
	// A sub-second TTL is a one-second lease, not the server's default.
	short := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "short", "--ttl", "400ms"))
	wantExpiry(t, "--ttl 400ms", short["RAFTLOCKD_CLIENT_EXPIRES_AT"], time.Second)

	// The lease survived all of that.
	mustCLI(t, env, `{"ok":true}`, "client", "update")
	mustCLI(t, env, "", "client", "release")
	wantJSON(t, "committed", mustCLI(t, srv.clientEnv(), "", "client", "get", "--key", "held"), `{"ok":true}`)

	// A server that is not there is an error too, not a hang.
	res = cli(t, []string{"RAFTLOCKD_CLIENT_SERVER=http://" + testutil.FreeAddr(t), "RAFTLOCKD_CLIENT_TIMEOUT=300ms"}, "",
		"client", "get", "--key", "x")
	if res.code == 0 || res.stderr == "" {
		t.Fatalf("get from no server: exit %d, stderr %q", res.code, res.stderr)
	}
}

// TestEnvForFlags checks that every flag can come from its environment
// variable, for client commands and for the server, and that a flag given
// on the command line wins.
func TestEnvForFlags(t *testing.T) {
	t.Parallel()
	dir, listen, raftListen := t.TempDir(), testutil.FreeAddr(t), testutil.FreeAddr(t)
	// The bundles come from RAFTLOCKD_BUNDLE (the server's) and
	// RAFTLOCKD_CLIENT_BUNDLE (the commands'): nothing is created in the
	// data dir, and the commands' TLS handshakes succeed only with them.
	bundles := t.TempDir()
	shareCA(t, bundles)
	serverBundle := filepath.Join(bundles, "tls", auth.ServerFile)
	// The node id comes from RAFTLOCKD_NODE_ID: the server must answer as
	// env-node before it counts as ready.
	srv := spawnServer(t, listen, nil, []string{
		"RAFTLOCKD_DATA_DIR=" + dir, "RAFTLOCKD_LISTEN=" + listen, "RAFTLOCKD_RAFT_LISTEN=" + raftListen,
		"RAFTLOCKD_RAFT_HEARTBEAT_TIMEOUT=200ms", "RAFTLOCKD_RAFT_ELECTION_TIMEOUT=200ms", "RAFTLOCKD_LOG_FORMAT=json",
		"RAFTLOCKD_GOSSIP_LISTEN=127.0.0.1:0", "RAFTLOCKD_NODE_ID=env-node", "RAFTLOCKD_BUNDLE=" + serverBundle,
		"RAFTLOCKD_DEFAULT_TTL=50s", "RAFTLOCKD_MAX_TTL=2m", "RAFTLOCKD_ACQUIRE_BLOCK=1s",
	})
	srv.nodeID = "env-node"
	cenv := func(extra ...string) []string {
		return srv.clientEnv(append([]string{"RAFTLOCKD_CLIENT_BUNDLE=" + filepath.Join(bundles, "tls", auth.ClientFile)}, extra...)...)
	}
	if err := srv.waitReady(dir, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "state.db")); err != nil {
		t.Fatalf("RAFTLOCKD_DATA_DIR not used: %v", err)
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "node-id")); err != nil || strings.TrimSpace(string(raw)) != "env-node" {
		t.Fatalf("the data dir keeps node id %q (%v), want RAFTLOCKD_NODE_ID's env-node", raw, err)
	}
	if !strings.Contains(srv.log.String(), `"msg":"raftlockd serving"`) {
		t.Fatalf("RAFTLOCKD_LOG_FORMAT=json not used; output:\n%s", srv.log.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "tls")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bundles were created although RAFTLOCKD_BUNDLE was set: %v", err)
	}
	// A client bundle of another CA does not get through: the bundles
	// from the environment are the ones in use.
	other := t.TempDir()
	shareCA(t, other)
	if res := cli(t, cenv("RAFTLOCKD_CLIENT_BUNDLE="+filepath.Join(other, "tls", auth.ClientFile)), "", "client", "get", "--key", "x"); res.code == 0 ||
		!strings.Contains(res.stderr, "certificate") {
		t.Fatalf("a client bundle of another CA: exit %d, stderr %q", res.code, res.stderr)
	}

	// Server lease policy: default TTL, maximum TTL (a longer TTL is
	// clamped) and the longest wait.
	dflt := parseExports(t, mustCLI(t, cenv(), "", "client", "acquire", "--key", "dflt"))
	wantExpiry(t, "RAFTLOCKD_DEFAULT_TTL", dflt["RAFTLOCKD_CLIENT_EXPIRES_AT"], 50*time.Second)
	capped := parseExports(t, mustCLI(t, cenv(), "", "client", "acquire", "--key", "capped", "--ttl", "1h"))
	wantExpiry(t, "RAFTLOCKD_MAX_TTL", capped["RAFTLOCKD_CLIENT_EXPIRES_AT"], 2*time.Minute)
	started := time.Now()
	res := cli(t, cenv(), "", "client", "acquire", "--key", "dflt")
	if took := time.Since(started); res.code == 0 || !strings.Contains(res.stderr, "waiting") || took > 15*time.Second {
		t.Fatalf("acquire of a held key with RAFTLOCKD_ACQUIRE_BLOCK=1s: exit %d after %s, stderr %q", res.code, took, res.stderr)
	}
	// Client: --block, --txn-id and --if-not-exists from the environment.
	res = cli(t, cenv("RAFTLOCKD_CLIENT_BLOCK=-1"), "", "client", "acquire", "--key", "dflt")
	if res.code == 0 || !strings.Contains(res.stderr, "held by another owner") {
		t.Fatalf("acquire with RAFTLOCKD_CLIENT_BLOCK=-1: exit %d, stderr %q", res.code, res.stderr)
	}
	joined := parseExports(t, mustCLI(t, cenv("RAFTLOCKD_CLIENT_TXN_ID="+dflt["RAFTLOCKD_CLIENT_TXN_ID"]), "",
		"client", "acquire", "--key", "joined"))
	if joined["RAFTLOCKD_CLIENT_TXN_ID"] != dflt["RAFTLOCKD_CLIENT_TXN_ID"] {
		t.Fatalf("RAFTLOCKD_CLIENT_TXN_ID not used: %v, want txn %s", joined, dflt["RAFTLOCKD_CLIENT_TXN_ID"])
	}
	mustCLI(t, cenv(envList(dflt)...), `{"d":1}`, "client", "update")
	mustCLI(t, cenv(envList(dflt)...), "", "client", "release")
	mustCLI(t, cenv(envList(capped)...), "", "client", "release")
	res = cli(t, cenv("RAFTLOCKD_CLIENT_IF_NOT_EXISTS=true"), "", "client", "acquire", "--key", "dflt")
	if res.code == 0 || !strings.Contains(res.stderr, "already_exists") {
		t.Fatalf("acquire with RAFTLOCKD_CLIENT_IF_NOT_EXISTS=true of a key with state: exit %d, stderr %q", res.code, res.stderr)
	}

	// Client: key, TTL, owner and namespace from the environment.
	env := cenv("RAFTLOCKD_CLIENT_KEY=from-env", "RAFTLOCKD_CLIENT_TTL=45s",
		"RAFTLOCKD_CLIENT_OWNER=env-owner", "RAFTLOCKD_CLIENT_NAMESPACE=envns")
	lease := parseExports(t, mustCLI(t, env, "", "client", "acquire"))
	if lease["RAFTLOCKD_CLIENT_KEY"] != "from-env" || lease["RAFTLOCKD_CLIENT_OWNER"] != "env-owner" ||
		lease["RAFTLOCKD_CLIENT_NAMESPACE"] != "envns" {
		t.Fatalf("acquire ignored the environment: %v", lease)
	}
	wantExpiry(t, "expiry from RAFTLOCKD_CLIENT_TTL", lease["RAFTLOCKD_CLIENT_EXPIRES_AT"], 45*time.Second)
	held := cenv(envList(lease)...)
	mustCLI(t, held, `{"env":true}`, "client", "update")
	mustCLI(t, held, "", "client", "release")
	wantJSON(t, "get with key and namespace from env", mustCLI(t, env, "", "client", "get"), `{"env":true}`)
	wantEmpty(t, "flag beats env", mustCLI(t, env, "", "client", "get", "--namespace", "default"))
	if d := describe(t, env, "from-env"); d.Namespace != "envns" || d.Version != 1 {
		t.Fatalf("describe: %+v", d)
	}

	// A variable that does not parse is reported by name.
	res = cli(t, cenv("RAFTLOCKD_CLIENT_TIMEOUT=soon"), "", "client", "get", "--key", "x")
	if res.code == 0 || !strings.Contains(res.stderr, "RAFTLOCKD_CLIENT_TIMEOUT") {
		t.Fatalf("bad RAFTLOCKD_CLIENT_TIMEOUT: exit %d, stderr %q", res.code, res.stderr)
	}

	// Server: a flag overrides its variable.
	dir2, listen2 := t.TempDir(), testutil.FreeAddr(t)
	srv2 := startServer(t, dir2, listen2, []string{"--listen", listen2, "--data-dir", dir2},
		[]string{"RAFTLOCKD_LISTEN=not-an-address", "RAFTLOCKD_DATA_DIR=" + filepath.Join(dir, "unused"),
			"RAFTLOCKD_RAFT_LISTEN=" + testutil.FreeAddr(t), "RAFTLOCKD_GOSSIP_LISTEN=127.0.0.1:0",
			"RAFTLOCKD_RAFT_HEARTBEAT_TIMEOUT=200ms", "RAFTLOCKD_RAFT_ELECTION_TIMEOUT=200ms"})
	lease2 := parseExports(t, mustCLI(t, srv2.clientEnv(), "", "client", "acquire", "--key", "k2"))
	mustCLI(t, srv2.clientEnv(envList(lease2)...), "", "client", "release")
	if _, err := os.Stat(filepath.Join(dir2, "state.db")); err != nil {
		t.Fatalf("--data-dir not used: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "unused")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("RAFTLOCKD_DATA_DIR was used although --data-dir was given: %v", err)
	}
}

// TestServerDefaults runs `raftlockd server` without flags: it must keep
// its state in $XDG_DATA_HOME/raftlockd, bootstrap a single-node cluster
// there with its CA and bundles, and resume from that state (and with the
// same bundles) after a restart; client commands find the client bundle in
// the default data directory. Only the addresses come from the
// environment, so that the test does not depend on the default ports being
// free; the default addresses themselves (127.0.0.1:9341, which is also
// the client's default server, :9342 and :9343) are checked in the help
// output.
func TestServerDefaults(t *testing.T) {
	home, xdg := t.TempDir(), t.TempDir()
	dataDir := filepath.Join(xdg, "raftlockd")
	base := []string{"HOME=" + home, "XDG_DATA_HOME=" + xdg}
	help := mustCLI(t, base, "", "server", "--help")
	for _, want := range []string{`(default "127.0.0.1:9341")`, `(default "127.0.0.1:9342")`, `(default "127.0.0.1:9343")`,
		`(default "` + dataDir + `")`} {
		if !strings.Contains(help, want) {
			t.Errorf("server --help lacks %s:\n%s", want, help)
		}
	}
	help = strings.Join(strings.Fields(mustCLI(t, base, "", "client", "--help")), " ")
	for _, want := range []string{"(default https://127.0.0.1:9341 with a bundle, http://127.0.0.1:9341 without;",
		"client.pem in $RAFTLOCKD_DATA_DIR/tls, else in " + filepath.Join(dataDir, "tls")} {
		if !strings.Contains(help, want) {
			t.Errorf("client --help lacks %q (the server's default address and bundles):\n%s", want, help)
		}
	}

	listen := testutil.FreeAddr(t)
	env := append(base, "RAFTLOCKD_LISTEN="+listen, "RAFTLOCKD_RAFT_LISTEN="+testutil.FreeAddr(t),
		"RAFTLOCKD_GOSSIP_LISTEN=127.0.0.1:0")
	start := func() *serverProc {
		t.Helper()
		p := spawnServer(t, listen, nil, env)
		if err := p.waitReady(dataDir, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// No scheme: https, since the commands find a bundle.
	env = append(env, "RAFTLOCKD_CLIENT_SERVER="+listen)
	srv := start()
	clientBundle, err := os.ReadFile(filepath.Join(dataDir, "tls", auth.ClientFile))
	if err != nil {
		t.Fatalf("no client bundle in the default data dir: %v", err)
	}
	nodeID, err := os.ReadFile(filepath.Join(dataDir, "node-id"))
	if err != nil {
		t.Fatalf("no node id in the default data dir: %v", err)
	}
	lease := parseExports(t, mustCLI(t, env, "", "client", "acquire", "--key", "persist"))
	if lease["RAFTLOCKD_CLIENT_FENCING_TOKEN"] != "1" {
		t.Fatalf("first acquire: %v, want fencing token 1", lease)
	}
	held := append(envList(lease), env...)
	mustCLI(t, held, `{"survives":"restart"}`, "client", "update")
	mustCLI(t, held, "", "client", "release")
	srv.stop()

	srv = start()
	if again, _ := os.ReadFile(filepath.Join(dataDir, "node-id")); !bytes.Equal(again, nodeID) {
		t.Fatalf("node id changed across restart: %q -> %q", nodeID, again)
	}
	if again, _ := os.ReadFile(filepath.Join(dataDir, "tls", auth.ClientFile)); !bytes.Equal(again, clientBundle) {
		t.Fatal("the client bundle was replaced by the restart")
	}
	wantJSON(t, "state after restart", mustCLI(t, env, "", "client", "get", "--key", "persist"), `{"survives":"restart"}`)
	lease = parseExports(t, mustCLI(t, env, "", "client", "acquire", "--key", "persist", "--block=-1"))
	if lease["RAFTLOCKD_CLIENT_FENCING_TOKEN"] != "2" || lease["RAFTLOCKD_CLIENT_VERSION"] != "1" {
		t.Fatalf("acquire after restart: %v, want fencing token 2 and version 1", lease)
	}
	mustCLI(t, append(envList(lease), env...), "", "client", "release", "--rollback")
	srv.stop()
}

// TestServerRefusesSettingsItCannotRun starts `raftlockd server` with
// settings that cannot work: each is refused at start, naming its flag,
// rather than replaced by a default, passed to Raft to be refused in
// Raft's own terms, or published to the cluster's peers.
func TestServerRefusesSettingsItCannotRun(t *testing.T) {
	for _, c := range []struct{ flag, value string }{
		{"raft-heartbeat-timeout", "0s"},
		{"raft-heartbeat-timeout", "-1s"},
		{"raft-heartbeat-timeout", "9ms"},
		{"raft-election-timeout", "0s"},
		{"raft-election-timeout", "100ms"},
		{"snapshot-interval", "0s"},
		{"snapshot-interval", "-1s"},
		{"snapshot-threshold", "0"},
		{"snapshot-trailing-logs", "0"},
		{"api-advertise", "127.0.0.1:9341"},
		{"api-advertise", "https://node1:9341/api"},
		{"api-advertise", "https://node1:99999"},
		{"node-id", "n1 "},
		{"tc-peer", "https://node1:99999"},
		{"tc-peer", "https://node1:9341/api"},
		{"tc-peer", "https://user@node1:9341"},
	} {
		t.Run(c.flag+"="+c.value, func(t *testing.T) {
			dir := t.TempDir()
			args := append(serverFlags(dir, testutil.FreeAddr(t), testutil.FreeAddr(t)), "--disable-mtls", "--"+c.flag+"="+c.value)
			res := cli(t, nil, "", append([]string{"server"}, args...)...)
			if res.code != 1 || !strings.Contains(res.stderr, c.flag) || strings.Contains(res.stderr, "panic") {
				t.Fatalf("exit %d, want 1 and an error naming %s:\n%s", res.code, c.flag, res.stderr)
			}
		})
	}
}

// A RAFTLOCKD_ variable that names no flag of `raftlockd server` (a typo in
// an environment file) is named in a warning at start; the variables of the
// client, queue, health and bench commands are not.
func TestServerWarnsOfUnknownVariables(t *testing.T) {
	dir, listen := t.TempDir(), testutil.FreeAddr(t)
	env := []string{"RAFTLOCKD_BOOTSTRAP_EXPECTED=3", "RAFTLOCKD_CLIENT_SERVER=" + listen, "RAFTLOCKD_HEALTH_LIVE=true",
		"RAFTLOCKD_QUEUE_NAME=jobs", "RAFTLOCKD_BENCH_RUNS=lock=1", "RAFTLOCKD_LOG_LEVEL=info"}
	p := startServer(t, dir, listen, append(serverFlags(dir, listen, testutil.FreeAddr(t)), "--disable-mtls"), env)
	p.stop()
	var warned []string
	for _, line := range strings.Split(p.log.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "RAFTLOCKD_") {
			warned = append(warned, line)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "RAFTLOCKD_BOOTSTRAP_EXPECTED") || strings.Count(warned[0], "RAFTLOCKD_") != 1 {
		t.Fatalf("warnings naming variables: %q, want one naming RAFTLOCKD_BOOTSTRAP_EXPECTED only", warned)
	}
}

// Commands missing what they need say so before sending anything: no
// server listens at the address given, so an answer naming the connection
// would mean the request was sent.
func TestCLIRefusesIncompleteCommandsBeforeSendingThem(t *testing.T) {
	t.Parallel()
	env := []string{"RAFTLOCKD_DATA_DIR=" + t.TempDir()}
	down := "http://" + testutil.FreeAddr(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"client", "release", "--server", down, "--key", "k"}, "no lease named"},
		{[]string{"client", "keepalive", "--server", down, "--lease", "l"}, "no lease named"},
		{[]string{"client", "update", "--server", down, "--key", "k", "-"}, "no lease named"},
		{[]string{"client", "remove", "--server", down, "--key", "k"}, "no lease named"},
		{[]string{"client", "queue", "ack", "--server", down, "--queue", "q", "--message-id", "m"}, "no delivery named"},
		{[]string{"client", "queue", "nack", "--server", down, "--lease", "l"}, "no delivery named"},
		{[]string{"client", "queue", "extend", "--server", down}, "no delivery named"},
		{[]string{"client", "get", "--server", down, "--key", "k", "--timeout", "-1s"}, "--timeout -1s"},
		{[]string{"client", "acquire", "--server", down, "--key", "k", "--ttl", "-5s"}, `"-5s" must not be negative`},
		{[]string{"client", "queue", "enqueue", "--server", down, "--queue", "q", "--delay", "-1"}, `"-1" must not be negative`},
		{[]string{"client", "get", "--key", "k", "--bundle", "/nonexistent/b.pem"}, "--bundle /nonexistent/b.pem"},
		{[]string{"bench", "--server", down, "--workload", "nosuch"}, `unknown workload "nosuch"`},
		{[]string{"bench", "--server", down, "--spawn", "-2"}, "--spawn -2"},
		{[]string{"bench", "--server", down, "--duration", "-1s"}, "--duration -1s"},
		{[]string{"bench", "--server", down, "--ops", "-5"}, "cannot be negative"},
		{[]string{"bench", "--server", down, "--payload", "-1"}, "cannot be negative"},
		{[]string{"client", "utxo", "block", "rollback", "--server", down, "--to-height", "-5"}, "--to-height -5: a block height is 0 to"},
		{[]string{"client", "utxo", "block", "rollback", "--server", down}, "--to-height is required"},
		{[]string{"snapshot", "save", "--server", down, t.TempDir()}, "is a directory"},
	} {
		wantFailure(t, env, c.args, c.want)
	}
	// The lease in the environment holds the key it names there: a command
	// naming another key does not present it.
	held := append(slices.Clone(env), clientEnv+"KEY=a", clientEnv+"LEASE=l-a", clientEnv+"FENCING_TOKEN=3")
	for _, args := range [][]string{
		{"client", "update", "--server", down, "--key", "b", "-"},
		{"client", "remove", "--server", down, "--key", "b"},
		{"client", "release", "--server", down, "--key", "b"},
	} {
		wantFailure(t, held, args, `no lease named for key "b": the lease in `+clientEnv+`LEASE holds "a"`)
	}
}

// A deprecated flag name sets the same setting as its new one: the new
// name on the command line beats the old name's variable, and the new
// name's variable beats the old one's.
func TestADeprecatedNamesVariableDoesNotOverrideTheSetting(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"RAFTLOCKD_TXN_RETENTION": "5m"}, []string{"--tc-decision-retention", "1h"}, "1h0m0s"},
		{map[string]string{"RAFTLOCKD_TXN_RETENTION": "5m", "RAFTLOCKD_TC_DECISION_RETENTION": "2h"}, nil, "2h0m0s"},
		{map[string]string{"RAFTLOCKD_TXN_RETENTION": "5m"}, nil, "5m0s"},
	} {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		cmd := newServerCmd()
		if err := cmd.Flags().Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if err := cmd.PreRunE(cmd, nil); err != nil {
			t.Fatal(err)
		}
		if got := cmd.Flags().Lookup("tc-decision-retention").Value.String(); got != c.want {
			t.Errorf("%v with %v: the decision retention is %s, want %s", c.args, c.env, got, c.want)
		}
		for k := range c.env {
			os.Unsetenv(k)
		}
	}
}

// The README: "update, remove, keepalive and release of another key ask
// for its --lease". Given that lease, a command for another key of the
// shell's transaction does not present the fencing token in the
// environment, which is the token of the key held there (and a keepalive,
// which needs a token, asks for the other key's).
func TestCLIAnotherKeysLeaseIsNotPresentedWithTheShellsToken(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	// a's first lease: the shell's lease on a gets token 2, b's gets 1.
	first := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "a"))
	mustCLI(t, srv.clientEnv(envList(first)...), "", "client", "release")
	out := bash(t, srv.clientEnv(), `
eval "$(raftlockd client acquire --key a)"
A_LEASE=$RAFTLOCKD_CLIENT_LEASE A_TOKEN=$RAFTLOCKD_CLIENT_FENCING_TOKEN
echo "A_TOKEN=$A_TOKEN"
eval "$(raftlockd client acquire --key b)"
echo "B_TOKEN=$RAFTLOCKD_CLIENT_FENCING_TOKEN"
echo '{"b":1}' | raftlockd client update >/dev/null
echo '{"a":2}' | raftlockd client update --key a --lease "$A_LEASE" >/dev/null
echo "A_HOLDER=$(raftlockd client get --key a --lease "$A_LEASE")"
echo "KEEPALIVE=$(raftlockd client keepalive --key a --lease "$A_LEASE" 2>&1 && echo succeeded)"
echo "KEEPALIVE_OUT=$(raftlockd client keepalive --key a --lease "$A_LEASE" --fencing-token "$A_TOKEN")"
eval "$(raftlockd client release --key a --lease "$A_LEASE")"
echo "A_AFTER=$(raftlockd client get --key a)"
echo "B_AFTER=$(raftlockd client get --key b)"
`)
	v := parseLines(out)
	if v["A_TOKEN"] != "2" || v["B_TOKEN"] != "1" {
		t.Fatalf("fencing tokens a %q, b %q: want 2 and 1", v["A_TOKEN"], v["B_TOKEN"])
	}
	wantJSON(t, "a's holder view", v["A_HOLDER"], `{"a":2}`)
	// a's expiry is not that of the shell's lease (b's).
	wantEmpty(t, "keepalive of a, not the shell's key", v["KEEPALIVE_OUT"])
	// A keepalive needs the token (the server requires one): it asks for
	// a's rather than send b's.
	if want := `no fencing token named for key "a": RAFTLOCKD_CLIENT_FENCING_TOKEN is the token of "b"; pass --fencing-token`; !strings.Contains(v["KEEPALIVE"], want) {
		t.Errorf("keepalive of a without its token: %q, want %q", v["KEEPALIVE"], want)
	}
	wantJSON(t, "a after the release", v["A_AFTER"], `{"a":2}`)
	wantJSON(t, "b after the release", v["B_AFTER"], `{"b":1}`)
}

// A key of the same name in another namespace is another key: the lease
// in the environment is not presented for it, so that get reads its
// committed state and update asks for its lease.
func TestCLIAKeyOfAnotherNamespaceIsAnotherKey(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	other := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--namespace", "other", "--key", "k"))
	mustCLI(t, srv.clientEnv(envList(other)...), `{"other":1}`, "client", "update")
	mustCLI(t, srv.clientEnv(envList(other)...), "", "client", "release")
	env := srv.clientEnv(envList(parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "k")))...)
	wantJSON(t, "get of other/k from a shell holding default/k", mustCLI(t, env, "", "client", "get", "--namespace", "other"), `{"other":1}`)
	res := cli(t, env, `{"other":2}`, "client", "update", "--namespace", "other")
	if want := `no lease named for key "other/k": the lease in RAFTLOCKD_CLIENT_LEASE holds "default/k"; pass --lease`; res.code == 0 ||
		!strings.Contains(res.stderr, want) {
		t.Fatalf("update of other/k from a shell holding default/k: exit %d, stderr %q; want %q", res.code, res.stderr, want)
	}
	mustCLI(t, env, "", "client", "release")
}

// --server takes several servers of a cluster: a command reaches the one
// that answers.
func TestCLIServerListPassesOverOneThatIsDown(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	env := append(srv.clientEnv(), "RAFTLOCKD_CLIENT_SERVER="+testutil.FreeAddr(t)+", "+srv.url)
	mustCLI(t, env, "", "client", "describe", "--key", "k")
	mustCLI(t, env, "", "client", "describe", "--key", "k", "--server", srv.url+","+testutil.FreeAddr(t))
}

// An empty entry of a server list (a stray comma) is refused, naming the
// list, instead of standing for the default server, which may be another
// cluster's.
func TestCLIServerListRefusesAnEmptyEntry(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	for _, list := range []string{srv.url + ",", "," + srv.url, srv.url + ", ," + srv.url} {
		res := cli(t, srv.clientEnv(), "", "client", "describe", "--key", "k", "--server", list)
		if res.code == 0 || !strings.Contains(res.stderr, "empty entry") {
			t.Fatalf("--server %q: exit %d, stderr %q; want a refusal naming the empty entry", list, res.code, res.stderr)
		}
	}
}
