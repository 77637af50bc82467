package api

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// The restore forwarder dials as the peer client does: with mTLS, it
// forwards no upload (a whole snapshot) to an http:// leader endpoint,
// where no certificate would be checked.
func TestTheRestoreForwarderCallsNoPeerOverPlainHTTP(t *testing.T) {
	var calls atomic.Int64
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls.Add(1) }))
	t.Cleanup(plain.Close)
	refuse := errors.New("no plain http")
	peer := &http.Client{Transport: &http.Transport{ // as server.peerHTTP builds it with mTLS
		DialTLSContext:  func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("tls") },
		TLSClientConfig: &tls.Config{},
		DialContext:     func(context.Context, string, string) (net.Conn, error) { return nil, refuse },
	}}
	h := &handler{Options: Options{PeerHTTP: peer}}
	resp, err := h.restoreForwarder().Post(plain.URL+"/v1/admin/restore", "application/octet-stream", nil)
	if err == nil {
		resp.Body.Close()
	}
	if calls.Load() != 0 {
		t.Fatalf("the restore upload reached a plain http endpoint (%d call)", calls.Load())
	}
}
