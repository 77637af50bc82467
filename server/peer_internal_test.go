package server

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/raftlockd/raftlockd/auth"
)

// A node that uses mTLS never calls a peer over plain http, where nobody's
// certificate is checked: an http:// endpoint already in its registry
// fails the call instead of reaching whoever answers there.
func TestPeersAreNeverCalledOverPlainHTTP(t *testing.T) {
	var calls atomic.Int64
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls.Add(1) }))
	t.Cleanup(plain.Close)
	c := peerHTTP(auth.NewChecker(nil, nil), nil)
	resp, err := c.Get(plain.URL + "/v1/tc/leader")
	if err == nil {
		_ = resp.Body.Close()
	}
	if !errors.Is(err, errPlainPeer) || calls.Load() != 0 {
		t.Fatalf("plain http peer: err %v, %d call(s) reached it", err, calls.Load())
	}
	// Without mTLS, plain http is the only way peers talk.
	resp, err = peerHTTP(nil, nil).Get(plain.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if calls.Load() != 1 {
		t.Fatalf("without mTLS: %d calls", calls.Load())
	}
}
