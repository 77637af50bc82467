package main

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/internal/testutil"
)

// servedSerial is the serial of the certificate the API at addr presents
// on a new connection, verified against roots.
func servedSerial(t testing.TB, addr string, roots *x509.CertPool) (string, error) {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return auth.SerialOf(conn.ConnectionState().PeerCertificates[0]), nil
}

// TestSIGHUPRotatesCertificate replaces a running server's bundle file
// with a new certificate of the same CA and sends SIGHUP: the process
// serves the new certificate without a restart, keeps its state and keeps
// answering client commands. A file that is not a server bundle is refused
// and the node keeps the certificate it has.
func TestSIGHUPRotatesCertificate(t *testing.T) {
	t.Parallel()
	dir, listen := t.TempDir(), testutil.FreeAddr(t)
	ca := shareCA(t, dir)
	bundle := filepath.Join(dir, "tls", auth.ServerFile)
	srv := startServer(t, dir, listen, append(serverFlags(dir, listen, testutil.FreeAddr(t)), "--bundle", bundle), nil)
	pid := srv.cmd.Process.Pid

	first, err := auth.LoadBundle(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := servedSerial(t, listen, ca.Roots()); err != nil || got != auth.SerialOf(first.Cert) {
		t.Fatalf("served certificate before the rotation: %s, %v; want %s", got, err, auth.SerialOf(first.Cert))
	}
	lease := parseExports(t, mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "rotated", "--ttl", "2m"))

	// The operator's rotation: the new bundle is written next to the old
	// one and renamed over it, then the process is told.
	next := testutil.Issue(t, ca, auth.RoleServer, auth.IssueOptions{Name: "rotated server",
		Hosts: []string{"127.0.0.1", "::1", "localhost", loopbackHost(t)}})
	if err := next.WriteFile(bundle); err != nil {
		t.Fatal(err)
	}
	want := auth.SerialOf(next.Cert)
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatalf("SIGHUP: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "the server to present the new certificate", func() bool {
		if srv.exited() {
			t.Fatalf("the server exited after SIGHUP (%v); output:\n%s", srv.waitErr, srv.log.String())
		}
		got, err := servedSerial(t, listen, ca.Roots())
		return err == nil && got == want
	})
	// The node logs the serial after it swaps the certificate in, so the
	// log line may trail the first handshake that shows it.
	testutil.WaitFor(t, 10*time.Second, "the server to log the new serial "+want, func() bool {
		return strings.Contains(srv.log.String(), want)
	})

	// The same process, with its state, still answers client commands.
	if srv.exited() || srv.cmd.Process.Pid != pid {
		t.Fatalf("the server restarted: pid %d, exited %v", srv.cmd.Process.Pid, srv.exited())
	}
	if d := describe(t, srv.clientEnv(), "rotated"); d.LeaseID != lease["RAFTLOCKD_CLIENT_LEASE"] {
		t.Fatalf("after the rotation the key is held by %q, want the lease taken before it (%s)", d.LeaseID, lease["RAFTLOCKD_CLIENT_LEASE"])
	}
	mustCLI(t, srv.clientEnv(envList(lease)...), "", "client", "release")

	// A client bundle in the server bundle's place is refused: the node
	// logs the failure and keeps serving the certificate it has.
	clientBundle, err := auth.LoadBundle(filepath.Join(dir, "tls", auth.ClientFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := clientBundle.WriteFile(bundle); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatalf("SIGHUP: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "the server to log the refused reload", func() bool {
		return strings.Contains(srv.log.String(), "reload failed")
	})
	if got, err := servedSerial(t, listen, ca.Roots()); err != nil || got != want {
		t.Fatalf("after a refused reload the server presents %s (%v), want %s", got, err, want)
	}
	if srv.exited() {
		t.Fatalf("the server exited after a refused reload; output:\n%s", srv.log.String())
	}
	describe(t, srv.clientEnv(), "rotated")
}
