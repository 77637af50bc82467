package server_test

import (
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/internal/lockedbuf"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/server"
)

// certExpiry scrapes the expiry of the node's certificate from /metrics.
func certExpiry(t *testing.T, srv *server.Server) int64 {
	t.Helper()
	resp, err := testutil.HTTPClient(t, testutil.ClientBundle(t)).Get(srv.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, body)
	}
	const name = "raftlockd_tls_certificate_expiry_timestamp_seconds "
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return int64(f)
		}
	}
	t.Fatalf("no %s in /metrics", strings.TrimSpace(name))
	return 0
}

// A node whose certificate expires within 30 days says so in its log when
// it starts and when it reloads its bundle, and /metrics tells when the
// certificate in use expires, a reload included.
func TestTheNodeWarnsOfItsCertificatesExpiry(t *testing.T) {
	cfg := testutil.Config(t, t.TempDir())
	bundle := func(validity time.Duration) *auth.Bundle {
		b := testutil.Issue(t, nil, auth.RoleServer, auth.IssueOptions{Name: "expiring",
			Hosts: []string{"127.0.0.1", "::1", "localhost"}, Validity: validity})
		if err := b.WriteFile(cfg.Bundle); err != nil {
			t.Fatal(err)
		}
		return b
	}
	soon := bundle(10 * 24 * time.Hour)
	var logs lockedbuf.Buffer
	srv, err := server.Start(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close(t.Context()) })
	testutil.WaitFor(t, 10*time.Second, "node to lead", func() bool { return srv.Node().IsLeader() })
	const warning = "the node's certificate expires soon"
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Fatalf("a start with a certificate expiring in 10 days warns %d times:\n%s", n, logs.String())
	}
	if got := certExpiry(t, srv); got != soon.Cert.NotAfter.Unix() {
		t.Fatalf("expiry %d, want %d", got, soon.Cert.NotAfter.Unix())
	}

	later := bundle(365 * 24 * time.Hour)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := certExpiry(t, srv); got != later.Cert.NotAfter.Unix() {
		t.Fatalf("after the reload: expiry %d, want %d", got, later.Cert.NotAfter.Unix())
	}
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Fatalf("a reload of a certificate valid for a year warns:\n%s", logs.String())
	}
	bundle(5 * 24 * time.Hour)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), warning); n != 2 {
		t.Fatalf("a reload of a certificate expiring in 5 days warns %d times in all:\n%s", n, logs.String())
	}
}
