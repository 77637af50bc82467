package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// inspect reads a bundle through `raftlockd auth inspect --format json`.
func inspect(t testing.TB, path string) bundleInfo {
	t.Helper()
	var info bundleInfo
	if out := mustCLI(t, nil, "", "auth", "inspect", path, "--format", "json"); json.Unmarshal([]byte(out), &info) != nil {
		t.Fatalf("auth inspect printed %q", out)
	}
	return info
}

// wantFailure runs the binary and requires a failure naming each of want
// on stderr.
func wantFailure(t testing.TB, env []string, args []string, want ...string) {
	t.Helper()
	res := cli(t, env, "", args...)
	if res.code == 0 {
		t.Errorf("raftlockd %s succeeded; want a failure naming %q", strings.Join(args, " "), want)
		return
	}
	for _, w := range want {
		if !strings.Contains(res.stderr, w) {
			t.Errorf("raftlockd %s: stderr %q lacks %q", strings.Join(args, " "), res.stderr, w)
		}
	}
}

// TestDefaultBootstrapTLS starts the single-node default with no flag but
// --data-dir: it creates a CA and its bundles in the data dir, and the
// commands find them there through RAFTLOCKD_DATA_DIR without --bundle,
// each group presenting its own (client, TC client, server).
func TestDefaultBootstrapTLS(t *testing.T) {
	t.Parallel()
	dir, listen := t.TempDir(), testutil.FreeAddr(t)
	srv := startServer(t, dir, listen, []string{"--data-dir", dir}, []string{"RAFTLOCKD_LISTEN=" + listen,
		"RAFTLOCKD_RAFT_LISTEN=" + testutil.FreeAddr(t), "RAFTLOCKD_GOSSIP_LISTEN=127.0.0.1:0"})
	for _, f := range []string{auth.CAFile, auth.ServerFile, auth.ClientFile, auth.TCClientFile} {
		st, err := os.Stat(filepath.Join(dir, "tls", f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want a file of mode 0600", f, err, st)
		}
	}
	if !strings.Contains(srv.log.String(), filepath.Join(dir, "tls", auth.ClientFile)) {
		t.Errorf("the server did not say where the client bundle is:\n%s", srv.log.String())
	}
	for f, role := range map[string]string{auth.ServerFile: "server", auth.ClientFile: "client", auth.TCClientFile: "tcclient"} {
		if info := inspect(t, filepath.Join(dir, "tls", f)); info.Role != role || info.Expired {
			t.Errorf("%s: %+v", f, info)
		}
	}

	// No --bundle and no scheme: https, with the data dir's client bundle.
	env := []string{"RAFTLOCKD_DATA_DIR=" + dir, "RAFTLOCKD_CLIENT_SERVER=" + listen}
	lease := parseExports(t, mustCLI(t, env, "", "client", "acquire", "--key", "k"))
	mustCLI(t, append(env, envList(lease)...), `{"tls":true}`, "client", "update")
	mustCLI(t, append(env, envList(lease)...), "", "client", "release")
	wantJSON(t, "committed over TLS", mustCLI(t, env, "", "client", "get", "--key", "k"), `{"tls":true}`)
	// The operator commands present the server bundle, the coordinator's
	// client commands the TC client bundle; a client bundle does neither.
	mustCLI(t, env, "", "cluster", "status")
	mustCLI(t, env, "", "tc", "leader")
	clientBundle := filepath.Join(dir, "tls", auth.ClientFile)
	wantFailure(t, env, []string{"cluster", "status", "--bundle", clientBundle}, "role_forbidden", "HTTP 403")
	wantFailure(t, env, []string{"tc", "leader", "--bundle", clientBundle}, "role_forbidden")

	// Elsewhere (no bundle found): an https URL is refused with the reason;
	// plain HTTP does not reach the TLS port.
	elsewhere := []string{"RAFTLOCKD_DATA_DIR=" + t.TempDir()}
	wantFailure(t, elsewhere, []string{"client", "get", "--key", "k", "--server", srv.url}, "no bundle was given",
		"RAFTLOCKD_CLIENT_BUNDLE", auth.ClientFile)
	wantFailure(t, elsewhere, []string{"client", "get", "--key", "k", "--server", listen})
}

// TestAuthNewCluster issues a cluster's bundles with `auth new cluster`
// (bound to the nodes' ids) and starts three nodes on them with --bundle:
// they form one cluster over TLS, and commands presenting the cluster's
// client bundle are served through any node.
func TestAuthNewCluster(t *testing.T) {
	t.Parallel()
	certs := filepath.Join(t.TempDir(), "certs")
	names := []string{"node1", "node2", "node3"}
	args := []string{"auth", "new", "cluster", "--dir", certs, "--shared-host", loopbackHost(t), "--bind-node-ids"}
	for _, n := range names {
		args = append(args, "--host", n)
	}
	out := mustCLI(t, nil, "", args...)
	files := []string{auth.CAFile, "node1.pem", "node2.pem", "node3.pem", auth.ClientFile, auth.TCClientFile}
	for _, f := range files {
		if st, err := os.Stat(filepath.Join(certs, f)); err != nil || st.Mode().Perm() != 0o600 || !strings.Contains(out, f) {
			t.Fatalf("%s: %v, mode %v; output %q", f, err, st, out)
		}
	}
	ca := inspect(t, filepath.Join(certs, auth.CAFile))
	node := inspect(t, filepath.Join(certs, "node2.pem"))
	if node.Role != "server" || node.Name != "node2" || node.Node != "node2" || node.CAFingerprint != ca.Fingerprint || !node.GossipKey ||
		!slices.Contains(node.Hosts, "node2") || !slices.Contains(node.Hosts, "localhost") ||
		!slices.Contains(node.Hosts, "127.0.0.1") || !slices.Contains(node.Hosts, loopbackHost(t)) || slices.Contains(node.Hosts, "node1") {
		t.Fatalf("node2.pem: %+v", node)
	}
	if cl := inspect(t, filepath.Join(certs, auth.ClientFile)); cl.Role != "client" || strings.Join(cl.Namespaces, ",") != "*:rw" {
		t.Fatalf("client.pem: %+v", cl)
	}
	// A second run keeps the CA: refused, or with --if-absent a success
	// that writes nothing.
	wantFailure(t, nil, args, "ca.pem exists", "--force")
	mustCLI(t, nil, "", append(args, "--if-absent")...)
	if again := inspect(t, filepath.Join(certs, auth.CAFile)); again.Fingerprint != ca.Fingerprint {
		t.Fatal("the CA was replaced")
	}

	var gossip []string
	for range names {
		gossip = append(gossip, testutil.FreeAddr(t))
	}
	var procs []*serverProc
	for i, n := range names {
		dir, listen := t.TempDir(), testutil.FreeAddr(t)
		p := spawnServer(t, listen, []string{"--node-id", n, "--data-dir", dir, "--bundle", filepath.Join(certs, n+".pem"),
			"--listen", listen, "--raft-listen", testutil.FreeAddr(t), "--gossip-listen", gossip[i],
			"--join", strings.Join(gossip, ","), "--bootstrap-expect", "3", "--gossip-profile", "fast",
			"--raft-heartbeat-timeout", "200ms", "--raft-election-timeout", "200ms"}, nil)
		p.nodeID = n
		procs = append(procs, p)
	}
	for _, p := range procs {
		if err := p.waitReady(p.dataDir, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(p.dataDir, "tls")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a node given --bundle created bundles of its own: %v", err)
		}
	}

	env := []string{"RAFTLOCKD_CLIENT_BUNDLE=" + filepath.Join(certs, auth.ClientFile)}
	lease := parseExports(t, mustCLI(t, env, "", "client", "acquire", "--key", "k", "--server", procs[1].url))
	held := append(env, envList(lease)...)
	mustCLI(t, held, `{"via":"node3"}`, "client", "update", "--server", procs[2].url)
	mustCLI(t, held, "", "client", "release", "--server", procs[0].url)
	for _, p := range procs {
		wantJSON(t, "read through "+p.url, mustCLI(t, env, "", "client", "get", "--key", "k", "--server", p.url), `{"via":"node3"}`)
	}
	var m wire.ClusterMembersResponse
	raw := mustCLI(t, nil, "", "cluster", "members", "--format", "json", "--server", procs[0].url,
		"--bundle", filepath.Join(certs, "node1.pem"))
	if err := json.Unmarshal([]byte(raw), &m); err != nil || len(m.Members) != 3 {
		t.Fatalf("members: %s", raw)
	}
	for _, mem := range m.Members {
		if mem.Suffrage != "voter" || !strings.HasPrefix(mem.APIEndpoint, "https://") {
			t.Errorf("member %+v", mem)
		}
	}
}

// TestNamespacePermissions issues client certificates limited to
// namespaces: outside them requests fail with namespace_forbidden (403),
// a read-only permission reads but does not lock, and no client
// certificate operates the cluster.
func TestNamespacePermissions(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	ca, dir := filepath.Join(srv.dataDir, "tls", auth.CAFile), t.TempDir()
	orders, readAll := filepath.Join(dir, "orders.pem"), filepath.Join(dir, "read-all.pem")
	mustCLI(t, nil, "", "auth", "new", "client", "--ca", ca, "--out", orders, "--namespace", "orders", "--name", "orders-app")
	mustCLI(t, nil, "", "auth", "new", "client", "--ca", ca, "--out", readAll, "--namespace", "*:r")

	env := srv.clientEnv("RAFTLOCKD_CLIENT_BUNDLE=" + orders)
	wantFailure(t, env, []string{"client", "acquire", "--key", "k"}, "namespace_forbidden", "HTTP 403", `"default"`)
	wantFailure(t, env, []string{"client", "queue", "stats", "--queue", "q", "--namespace", "billing"}, "namespace_forbidden")
	lease := parseExports(t, mustCLI(t, env, "", "client", "acquire", "--key", "k", "--namespace", "orders"))
	mustCLI(t, append(env, envList(lease)...), `{"order":1}`, "client", "update")
	mustCLI(t, append(env, envList(lease)...), "", "client", "release")

	ro := srv.clientEnv("RAFTLOCKD_CLIENT_BUNDLE="+readAll, "RAFTLOCKD_CLIENT_NAMESPACE=orders")
	wantJSON(t, "read with *:r", mustCLI(t, ro, "", "client", "get", "--key", "k"), `{"order":1}`)
	wantFailure(t, ro, []string{"client", "acquire", "--key", "k2"}, "namespace_forbidden")
	wantFailure(t, env, []string{"cluster", "status"}, "role_forbidden")
	wantFailure(t, env, []string{"auth", "revoked"}, "role_forbidden")
}

// issueClient issues, with `auth new client` and the CA of srv's data
// directory, a client bundle allowed namespace ns and returns its path.
func issueClient(t testing.TB, srv *serverProc, ns string) string {
	t.Helper()
	app := filepath.Join(t.TempDir(), "app.pem")
	mustCLI(t, nil, "", "auth", "new", "client", "--ca", filepath.Join(srv.dataDir, "tls", auth.CAFile), "--out", app,
		"--namespace", ns)
	return app
}

// TestNamespacePermissionIgnoresCase issues a client certificate for a
// namespace spelled with capitals: the server lower-cases the namespaces
// requests name, so the certificate covers the namespace however a
// request spells it.
func TestNamespacePermissionIgnoresCase(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	app := issueClient(t, srv, "Orders")
	if ns := inspect(t, app).Namespaces; !slices.Equal(ns, []string{"orders:rw"}) {
		t.Fatalf("auth inspect shows namespaces %q, want [orders:rw]", ns)
	}
	env := srv.clientEnv("RAFTLOCKD_CLIENT_BUNDLE=" + app)
	for _, ns := range []string{"Orders", "orders"} {
		lease := parseExports(t, mustCLI(t, env, "", "client", "acquire", "--key", "k", "--namespace", ns))
		mustCLI(t, append(env, envList(lease)...), "", "client", "release")
	}
	wantFailure(t, env, []string{"client", "acquire", "--key", "k", "--namespace", "billing"}, "namespace_forbidden")
}

// TestRevokeClient revokes a client certificate by the serial `auth
// inspect` shows: its next request fails with certificate_revoked, while
// other certificates keep working.
func TestRevokeClient(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	app := issueClient(t, srv, "*")
	env := srv.clientEnv("RAFTLOCKD_CLIENT_BUNDLE=" + app)
	mustCLI(t, env, "", "client", "get", "--key", "k")

	serial := inspect(t, app).Serial
	if out := mustCLI(t, srv.clientEnv(), "", "auth", "revoke", "client", serial, "--reason", "laptop lost"); out != "revoked "+serial+"\n" {
		t.Fatalf("revoke printed %q", out)
	}
	wantFailure(t, env, []string{"client", "get", "--key", "k"}, "certificate_revoked", "HTTP 401")
	if out := mustCLI(t, srv.clientEnv(), "", "auth", "revoke", "client", serial); !strings.Contains(out, "already revoked") {
		t.Fatalf("second revoke printed %q", out)
	}
	var list wire.RevocationsResponse
	if err := json.Unmarshal([]byte(mustCLI(t, srv.clientEnv(), "", "auth", "revoked", "--format", "json")), &list); err != nil ||
		len(list.Revoked) != 1 || list.Revoked[0].Serial != serial || list.Revoked[0].Reason != "laptop lost" {
		t.Fatalf("revoked list: %+v %v", list, err)
	}
	if table := mustCLI(t, srv.clientEnv(), "", "auth", "revoked"); !strings.Contains(table, serial) || !strings.Contains(table, "laptop lost") {
		t.Fatalf("revoked table:\n%s", table)
	}
	// The data dir's client bundle is another certificate: still served.
	mustCLI(t, srv.clientEnv(), "", "client", "get", "--key", "k")
	wantFailure(t, srv.clientEnv(), []string{"auth", "revoke", "server", serial}, "client SERIAL or tcclient SERIAL")
	// The certificate a revocation is made with cannot revoke itself: the
	// operator would be locked out of the commands that could undo it.
	own := inspect(t, filepath.Join(srv.dataDir, "tls", "server.pem")).Serial
	wantFailure(t, srv.clientEnv(), []string{"auth", "revoke", "client", own}, "invalid_params", "lock its holder out")
	mustCLI(t, srv.clientEnv(), "", "auth", "revoked")
	wantFailure(t, srv.clientEnv(), []string{"auth", "revoke", "client", "not-hex"}, "invalid_params")
}

// TestTrustRoundTrip adds a partner's CA to the trust list, lists and
// removes it: while it is trusted, the partner's TC client certificates
// reach the coordinator's client endpoints (and nothing else).
func TestTrustRoundTrip(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	dir := t.TempDir()
	partner, partnerTC, partnerClient := filepath.Join(dir, "partner-ca.pem"), filepath.Join(dir, "tc.pem"), filepath.Join(dir, "app.pem")
	mustCLI(t, nil, "", "auth", "new", "ca", "--out", partner, "--name", "partner CA")
	mustCLI(t, nil, "", "auth", "new", "tcclient", "--ca", partner, "--out", partnerTC)
	mustCLI(t, nil, "", "auth", "new", "client", "--ca", partner, "--out", partnerClient, "--namespace", "*")
	fingerprint := inspect(t, partner).Fingerprint

	// The partner's certificates, checking the server against this island's CA.
	own, err := auth.LoadBundle(filepath.Join(srv.dataDir, "tls", auth.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	as := func(path string) *client.Client {
		b, err := auth.LoadBundle(path)
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(srv.url, client.WithRetry(0), client.WithTLS(&tls.Config{MinVersion: tls.VersionTLS12,
			RootCAs: own.Roots(), Certificates: []tls.Certificate{b.TLSCertificate()}}))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	tcc, app := as(partnerTC), as(partnerClient)
	if _, err := tcc.TCLeader(ctx); !errors.Is(err, errcode.CertificateUntrusted) {
		t.Fatalf("tc leader before the CA is trusted: %v", err)
	}

	out := mustCLI(t, srv.clientEnv(), "", "tc", "trust", "add", partner, "--name", "partner")
	if !strings.Contains(out, fingerprint) || !strings.Contains(out, "partner") {
		t.Fatalf("trust add printed %q", out)
	}
	var list wire.TrustListResponse
	if err := json.Unmarshal([]byte(mustCLI(t, srv.clientEnv(), "", "tc", "trust", "list", "--format", "json")), &list); err != nil ||
		len(list.Trusted) != 1 || list.Trusted[0].Fingerprint != fingerprint || list.Trusted[0].Name != "partner" ||
		list.Trusted[0].Subject != "CN=partner CA" {
		t.Fatalf("trust list: %+v %v", list, err)
	}
	if strings.Contains(list.Trusted[0].CertPEM, "PRIVATE KEY") || !strings.Contains(list.Trusted[0].CertPEM, "CERTIFICATE") {
		t.Fatalf("the trust list holds %q", list.Trusted[0].CertPEM)
	}
	if _, err := tcc.TCLeader(ctx); err != nil {
		t.Fatalf("tc leader with a trusted CA's TC client certificate: %v", err)
	}
	if _, err := app.GetPublic(ctx, "", "k"); !errors.Is(err, errcode.CertificateUntrusted) {
		t.Fatalf("a trusted partner's client certificate on a client endpoint: %v", err)
	}

	if out := mustCLI(t, srv.clientEnv(), "", "tc", "trust", "remove", fingerprint); out != "removed\n" {
		t.Fatalf("trust remove printed %q", out)
	}
	if out := mustCLI(t, srv.clientEnv(), "", "tc", "trust", "remove", fingerprint); out != "not on the trust list\n" {
		t.Fatalf("second trust remove printed %q", out)
	}
	if out := strings.TrimSpace(mustCLI(t, srv.clientEnv(), "", "tc", "trust", "list")); strings.Contains(out, fingerprint) {
		t.Fatalf("trust list after remove:\n%s", out)
	}
	if _, err := tcc.TCLeader(ctx); !errors.Is(err, errcode.CertificateUntrusted) {
		t.Fatalf("tc leader after the CA was removed: %v", err)
	}
	wantFailure(t, srv.clientEnv(), []string{"tc", "trust", "add", filepath.Join(dir, "missing.pem")}, "missing.pem")
}

// TestAuthInspect issues every kind of bundle and reads them back.
func TestAuthInspect(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	mustCLI(t, nil, "", "auth", "new", "ca", "--out", path("ca.pem"), "--name", "inspect CA")
	mustCLI(t, nil, "", "auth", "new", "server", "--ca", path("ca.pem"), "--out", path("s.pem"), "--host", "db1.example",
		"--host", "10.1.2.3", "--validity", "30d", "--node-id", "db1")
	mustCLI(t, nil, "", "auth", "new", "client", "--ca", path("ca.pem"), "--out", path("c.pem"), "--namespace", "orders",
		"--namespace", "billing:r", "--name", "app")
	mustCLI(t, nil, "", "auth", "new", "tcclient", "--ca", path("ca.pem"), "--out", path("t.pem"), "--validity", "1ms")

	ca, srv, cl, tcc := inspect(t, path("ca.pem")), inspect(t, path("s.pem")), inspect(t, path("c.pem")), inspect(t, path("t.pem"))
	if ca.Role != "ca" || ca.Name != "inspect CA" || !ca.GossipKey || ca.Fingerprint != ca.CAFingerprint ||
		ca.NotAfter.Before(time.Now().Add(9*365*24*time.Hour)) {
		t.Errorf("CA: %+v", ca)
	}
	if srv.Role != "server" || srv.Name != "db1.example" || strings.Join(srv.Hosts, ",") != "db1.example,10.1.2.3" ||
		!srv.GossipKey || srv.CA != "inspect CA" || srv.CAFingerprint != ca.Fingerprint || srv.Node != "db1" ||
		srv.NotAfter.Sub(time.Now().Add(30*24*time.Hour)).Abs() > time.Hour {
		t.Errorf("server: %+v", srv)
	}
	if cl.Role != "client" || cl.Name != "app" || strings.Join(cl.Namespaces, ",") != "orders:rw,billing:r" || cl.GossipKey || cl.Node != "" ||
		len(cl.Hosts) != 0 || cl.Expired || cl.Serial == "" || cl.Serial == srv.Serial {
		t.Errorf("client: %+v", cl)
	}
	if tcc.Role != "tcclient" || tcc.Name != "raftlockd tcclient" || !tcc.Expired {
		t.Errorf("TC client (valid for 1ms): %+v", tcc)
	}
	if table := mustCLI(t, nil, "", "auth", "inspect", path("s.pem")); !strings.Contains(table, "node id      db1") {
		t.Errorf("inspect table of a bundle bound to db1:\n%s", table)
	}
	table := mustCLI(t, nil, "", "auth", "inspect", path("c.pem"))
	for _, want := range []string{"role         client", "namespaces   orders:rw, billing:r", "serial       " + cl.Serial,
		"ca           inspect CA (" + ca.Fingerprint + ")", "gossip key   no"} {
		if !strings.Contains(table, want) {
			t.Errorf("inspect table lacks %q:\n%s", want, table)
		}
	}
	for _, f := range []string{"ca.pem", "s.pem", "c.pem", "t.pem"} {
		if st, err := os.Stat(path(f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", f, err, st)
		}
	}

	// --out does not replace a file unless --force.
	before, _ := os.ReadFile(path("c.pem"))
	again := []string{"auth", "new", "client", "--ca", path("ca.pem"), "--out", path("c.pem"), "--namespace", "orders"}
	wantFailure(t, nil, again, "c.pem exists", "--force")
	if after, _ := os.ReadFile(path("c.pem")); !bytes.Equal(before, after) {
		t.Fatal("a refused --out changed the file")
	}
	mustCLI(t, nil, "", append(again, "--force")...)
	if inspect(t, path("c.pem")).Serial == cl.Serial {
		t.Fatal("--force did not replace the bundle")
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"auth", "new", "client", "--ca", path("ca.pem"), "--out", path("x.pem")}, "--namespace is required"},
		{[]string{"auth", "new", "client", "--ca", path("ca.pem"), "--out", path("x.pem"), "--namespace", "orders:x"}, "mode must be r or rw"},
		{[]string{"auth", "new", "client", "--ca", path("c.pem"), "--out", path("x.pem"), "--namespace", "a"}, "not a CA bundle"},
		{[]string{"auth", "new", "server", "--ca", path("ca.pem"), "--out", path("x.pem")}, "--host is required"},
		{[]string{"auth", "new", "tcclient", "--ca", path("ca.pem"), "--out", path("x.pem"), "--validity", "soon"}, "--validity"},
		{[]string{"auth", "new", "tcclient", "--out", path("x.pem")}, "--ca is required"},
		{[]string{"auth", "inspect", path("missing.pem")}, "missing.pem"},
		{[]string{"auth", "inspect", path("c.pem"), "--format", "yaml"}, "--format"},
	} {
		wantFailure(t, nil, c.args, c.want)
	}
	if _, err := os.Stat(path("x.pem")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused command wrote a bundle: %v", err)
	}
}

func TestParseValidity(t *testing.T) {
	for in, want := range map[string]time.Duration{"": 0, "1h": time.Hour, "90d": 90 * 24 * time.Hour, "1.5h": 90 * time.Minute, "36500d": 36500 * 24 * time.Hour} {
		if got, err := parseValidity(in); err != nil || got != want {
			t.Errorf("parseValidity(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"0", "-1h", "0d", "d", "1w", "5", "36501d", "213504d", "1000000000d"} {
		if _, err := parseValidity(bad); err == nil {
			t.Errorf("parseValidity(%q): want an error", bad)
		}
	}
}

// TestDisableMTLS: with --disable-mtls the node serves plain HTTP, creates
// no bundles and warns at every start; the commands, finding no bundle,
// speak plain HTTP to it.
func TestDisableMTLS(t *testing.T) {
	t.Parallel()
	dir, listen := t.TempDir(), testutil.FreeAddr(t)
	flags := serverFlags(dir, listen, testutil.FreeAddr(t))
	const warning = "mTLS is disabled"
	srv := startServer(t, dir, listen, append(flags, "--disable-mtls"), nil)
	if !strings.HasPrefix(srv.url, "http://") || !strings.Contains(srv.log.String(), "level=WARN msg=\""+warning) {
		t.Fatalf("no warning at start; output:\n%s", srv.log.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "tls")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bundles were created with mTLS disabled: %v", err)
	}
	env := []string{"RAFTLOCKD_DATA_DIR=" + dir, "RAFTLOCKD_CLIENT_SERVER=" + listen}
	lease := parseExports(t, mustCLI(t, env, "", "client", "acquire", "--key", "plain"))
	mustCLI(t, append(env, envList(lease)...), `{"plain":true}`, "client", "update")
	mustCLI(t, append(env, envList(lease)...), "", "client", "release")
	mustCLI(t, env, "", "cluster", "status")
	// The health check in the server's environment probes plain HTTP.
	res := cli(t, []string{"RAFTLOCKD_DATA_DIR=" + dir, "RAFTLOCKD_LISTEN=" + listen, "RAFTLOCKD_DISABLE_MTLS=true"}, "", "health")
	if res.code != 0 || !strings.Contains(res.stdout, "http://"+listen) {
		t.Fatalf("health: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	srv.stop()

	// Restarted with the variable instead of the flag: the warning again.
	srv = startServer(t, dir, listen, flags, []string{"RAFTLOCKD_DISABLE_MTLS=true"})
	if !strings.Contains(srv.log.String(), warning) {
		t.Fatalf("no warning at the second start; output:\n%s", srv.log.String())
	}
	wantJSON(t, "state after restart", mustCLI(t, env, "", "client", "get", "--key", "plain"), `{"plain":true}`)
}

// `auth extend` writes the bridge bundle of a move to a new CA: the node's
// own certificate, both CAs, and the other CA's gossip key to read.
func TestAuthExtend(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	mustCLI(t, nil, "", "auth", "new", "ca", "--out", path("old-ca.pem"), "--name", "old CA")
	mustCLI(t, nil, "", "auth", "new", "ca", "--out", path("new-ca.pem"), "--name", "new CA")
	mustCLI(t, nil, "", "auth", "new", "server", "--ca", path("old-ca.pem"), "--out", path("node.pem"), "--host", "node1")
	before := inspect(t, path("node.pem"))
	mustCLI(t, nil, "", "auth", "extend", path("node.pem"), "--with", path("new-ca.pem"))
	after := inspect(t, path("node.pem"))
	newCA := inspect(t, path("new-ca.pem"))
	if after.Serial != before.Serial || after.CA != "old CA" || after.AcceptedGossipKeys != 1 ||
		len(after.ExtraCAs) != 1 || !strings.Contains(after.ExtraCAs[0], newCA.Fingerprint) {
		t.Fatalf("extended in place: %+v", after)
	}
	table := mustCLI(t, nil, "", "auth", "inspect", path("node.pem"))
	for _, want := range []string{"also trusts  new CA (" + newCA.Fingerprint + ")", "gossip key   yes (and reads 1 more)"} {
		if !strings.Contains(table, want) {
			t.Errorf("inspect table lacks %q:\n%s", want, table)
		}
	}
	b, err := auth.LoadBundle(path("node.pem"))
	if err != nil {
		t.Fatal(err)
	}
	oldKey, err := auth.LoadBundle(path("old-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.GossipKey, oldKey.GossipKey) {
		t.Fatal("the extended bundle no longer sends with its own gossip key")
	}
	// --out leaves the bundle as it was; --with must name a bundle.
	mustCLI(t, nil, "", "auth", "new", "server", "--ca", path("new-ca.pem"), "--out", path("new-node.pem"), "--host", "node1")
	mustCLI(t, nil, "", "auth", "extend", path("new-node.pem"), "--with", path("old-ca.pem"), "--out", path("bridge.pem"))
	if inspect(t, path("new-node.pem")).AcceptedGossipKeys != 0 || inspect(t, path("bridge.pem")).AcceptedGossipKeys != 1 {
		t.Fatal("--out changed the source bundle, or wrote no bridge")
	}
	if r := cli(t, nil, "", "auth", "extend", path("node.pem")); r.code == 0 || !strings.Contains(r.stderr, "--with is required") {
		t.Fatalf("without --with: %d %s", r.code, r.stderr)
	}
}

// `auth new cluster --if-absent` (the compose file's certs service) takes
// ca.pem for a finished run: a run that stopped part way (here a bundle it
// could not write) leaves no ca.pem, so the next one writes every bundle
// instead of leaving the nodes without theirs for good.
func TestAuthNewClusterIfAbsentAfterAnUnfinishedRun(t *testing.T) {
	t.Parallel()
	certs := filepath.Join(t.TempDir(), "certs")
	if err := os.MkdirAll(filepath.Join(certs, "node2.pem"), 0o700); err != nil { // not a file: writing it fails
		t.Fatal(err)
	}
	args := []string{"auth", "new", "cluster", "--dir", certs, "--host", "node1", "--host", "node2", "--if-absent"}
	wantFailure(t, nil, args, "node2.pem")
	if err := os.Remove(filepath.Join(certs, "node2.pem")); err != nil {
		t.Fatal(err)
	}
	out := mustCLI(t, nil, "", args...)
	for _, f := range []string{auth.CAFile, "node1.pem", "node2.pem", auth.ClientFile, auth.TCClientFile} {
		if _, err := os.Stat(filepath.Join(certs, f)); err != nil {
			t.Errorf("%s after the second run: %v; it printed %q", f, err, out)
		}
	}
	ca := inspect(t, filepath.Join(certs, auth.CAFile))
	if n := inspect(t, filepath.Join(certs, "node1.pem")); n.CAFingerprint != ca.CAFingerprint {
		t.Fatalf("node1.pem is of CA %s, ca.pem is %s", n.CAFingerprint, ca.CAFingerprint)
	}
}
