package api

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
)

// Every code the server can answer with has its status in the one table
// and is documented; only the server's own failures are 5xx.
func TestEveryErrorCodeHasAStatusAndIsDocumented(t *testing.T) {
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("docs: %v %v", docs, err)
	}
	var all strings.Builder
	for _, p := range docs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	// The 5xx answers: a bug, a cluster that cannot serve now, and a
	// coordinator whose peers (other islands) did not answer.
	server := map[string]bool{errcode.Internal.Code: true,
		errcode.TxnFanoutFailed.Code: true, errcode.TCRMReplication.Code: true}
	codes := errcode.All()
	if len(codes) < 50 {
		t.Fatalf("only %d codes registered", len(codes))
	}
	for _, c := range codes {
		s, ok := statusOf[c]
		switch {
		case !ok:
			t.Errorf("%s has no HTTP status (it would answer 500)", c)
		case s >= 500 && s != http.StatusServiceUnavailable && !server[c]:
			t.Errorf("%s answers %d", c, s)
		}
		if !regexp.MustCompile(`\b` + c + `\b`).MatchString(all.String()) {
			t.Errorf("%s is not in docs/", c)
		}
	}
}

// followerOf is a follower whose leader is at endpoint.
type followerOf struct{ endpoint string }

func (followerOf) IsLeader() bool                  { return false }
func (f followerOf) Leader() (id, endpoint string) { return "n1", f.endpoint }
func (followerOf) BackendHash() string             { return "island" }

// brokenBody is a request body that breaks off.
type brokenBody struct{}

func (brokenBody) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// A coordinator request a follower cannot read is refused as on the
// leader: a body that breaks off is invalid_body, not request_too_large,
// and only a body over the limit is request_too_large.
func TestAFollowerReadsACoordinatorRequestAsTheLeaderDoes(t *testing.T) {
	h := &handler{Options: Options{MaxBodyBytes: 64, NodeID: "n2", LeaderOf: followerOf{"http://127.0.0.1:1"}}}
	next := func(http.ResponseWriter, *http.Request) error { t.Fatal("served on a follower"); return nil }
	for body, want := range map[io.Reader]*errcode.Error{
		brokenBody{}: errcode.InvalidBody,
		strings.NewReader(strings.Repeat("x", 65)): errcode.RequestTooLarge,
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/txn/decide", body)
		if err := h.leaderOnly(next)(httptest.NewRecorder(), r); !errors.Is(err, want) {
			t.Errorf("%T body: %v, want %s", body, err, want.Code)
		}
	}
}
