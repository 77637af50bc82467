package testutil

import (
	"net/http"
	"path/filepath"
	"sync"
	"testing"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
)

var (
	caOnce sync.Once
	ca     *auth.Bundle
	caErr  error
)

// CA is a certificate authority shared by the tests of one process.
func CA(t testing.TB) *auth.Bundle {
	t.Helper()
	caOnce.Do(func() { ca, caErr = auth.NewCA(auth.IssueOptions{Name: "raftlockd test CA"}) })
	if caErr != nil {
		t.Fatalf("test CA: %v", caErr)
	}
	return ca
}

// Issue signs a certificate for role with ca (the shared CA when nil).
func Issue(t testing.TB, ca *auth.Bundle, role auth.Role, o auth.IssueOptions) *auth.Bundle {
	t.Helper()
	if ca == nil {
		ca = CA(t)
	}
	if o.Name == "" {
		o.Name = "test " + string(role)
	}
	b, err := ca.Issue(role, o)
	if err != nil {
		t.Fatalf("issue %s certificate: %v", role, err)
	}
	return b
}

// ServerBundle writes a server bundle of ca (the shared CA when nil),
// valid for the loopback addresses, localhost and hosts, to dir/server.pem
// and returns its path.
func ServerBundle(t testing.TB, dir string, ca *auth.Bundle, hosts ...string) string {
	t.Helper()
	b := Issue(t, ca, auth.RoleServer, auth.IssueOptions{Name: "test server",
		Hosts: append([]string{"127.0.0.1", "::1", "localhost"}, hosts...)})
	path := filepath.Join(dir, "server.pem")
	if err := b.WriteFile(path); err != nil {
		t.Fatalf("write server bundle: %v", err)
	}
	return path
}

// ClientBundle is a client bundle of the shared CA allowed every namespace.
func ClientBundle(t testing.TB) *auth.Bundle {
	t.Helper()
	return ClientBundleOf(t, nil)
}

// ClientBundleOf is a client bundle of ca (the shared CA when nil) allowed
// every namespace.
func ClientBundleOf(t testing.TB, ca *auth.Bundle) *auth.Bundle {
	t.Helper()
	return Issue(t, ca, auth.RoleClient, auth.IssueOptions{Perms: []auth.Perm{{Namespace: "*", Write: true}}})
}

// OperatorBundle is a server certificate of ca (the shared CA when nil),
// as an operator on one of the island's nodes holds it: it may call every
// endpoint, the administrative ones included.
func OperatorBundle(t testing.TB, ca *auth.Bundle) *auth.Bundle {
	t.Helper()
	return Issue(t, ca, auth.RoleServer, auth.IssueOptions{Name: "test operator"})
}

// HTTPClient is an HTTP client presenting b (a client bundle of the
// shared CA allowed every namespace when nil).
func HTTPClient(t testing.TB, b *auth.Bundle) *http.Client {
	t.Helper()
	if b == nil {
		b = ClientBundle(t)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: auth.ClientConfig(b)}}
}

// OperatorHTTPClient is an HTTP client presenting a server certificate of
// the shared CA (see OperatorBundle).
func OperatorHTTPClient(t testing.TB) *http.Client {
	t.Helper()
	return HTTPClient(t, OperatorBundle(t, nil))
}

// Client is an SDK client for url presenting a client certificate of the
// shared CA allowed every namespace.
func Client(t testing.TB, url string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, append([]client.Option{client.WithBundle(ClientBundle(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// OperatorClient is an SDK client for url presenting a server certificate
// of the shared CA (see OperatorBundle).
func OperatorClient(t testing.TB, url string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, append([]client.Option{client.WithBundle(OperatorBundle(t, nil))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
