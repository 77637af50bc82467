package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
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

// followerOf is a follower whose leader is at endpoint; when moved is
// not nil, the leader moves once it is closed.
type followerOf struct {
	endpoint string
	moved    chan struct{}
}

func (followerOf) IsLeader() bool                  { return false }
func (f followerOf) Leader() (id, endpoint string) { return "n1", f.endpoint }
func (f followerOf) AwaitLeader(context.Context) (id, endpoint string, err error) {
	return "n1", f.endpoint, nil
}
func (followerOf) BackendHash() string { return "island" }

func (f followerOf) WhileLeads(ctx context.Context, _ string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	if f.moved != nil {
		go func() {
			select {
			case <-f.moved:
				cancel(errors.New("the leader changed"))
			case <-ctx.Done():
			}
		}()
	}
	return ctx, func() { cancel(nil) }
}

// brokenBody is a request body that breaks off.
type brokenBody struct{}

func (brokenBody) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// A coordinator request a follower cannot read is refused as on the
// leader: a body that breaks off is invalid_body, not request_too_large,
// and only a body over the limit is request_too_large.
func TestAFollowerReadsACoordinatorRequestAsTheLeaderDoes(t *testing.T) {
	h := &handler{Options: Options{MaxBodyBytes: 64, NodeID: "n2", LeaderOf: followerOf{endpoint: "http://127.0.0.1:1"}}}
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

// A coordinator request a follower hands to a leader that stops answering
// (a paused process) ends once another leader is known: 503 unavailable,
// to be retried, instead of waiting for as long as the client does.
func TestAFollowerStopsWaitingForALeaderThatMoved(t *testing.T) {
	stop := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(hung.Close)
	t.Cleanup(func() { close(stop) }) // before hung.Close
	moved := make(chan struct{})
	h := &handler{Options: Options{MaxBodyBytes: 64, NodeID: "n2", LeaderOf: followerOf{hung.URL, moved}}}
	next := func(http.ResponseWriter, *http.Request) error { t.Fatal("served on a follower"); return nil }
	errc := make(chan error, 1)
	go func() {
		r := httptest.NewRequest(http.MethodPost, "/v1/txn/decide", strings.NewReader("{}"))
		errc <- h.leaderOnly(next)(httptest.NewRecorder(), r)
	}()
	close(moved)
	select {
	case err := <-errc:
		if !errors.Is(err, errcode.Unavailable) {
			t.Fatalf("the forward to a leader that moved answered %v, want unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the forward still waits for a leader that moved")
	}
}

// A follower hands a coordinator request to the leader with what is left
// of the client's X-Raftlockd-Timeout, not the whole of it again.
func TestAFollowerPassesOnWhatIsLeftOfTheTimeout(t *testing.T) {
	got := make(chan string, 1)
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get(wire.HeaderTimeout)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(leader.Close)
	h := &handler{Options: Options{MaxBodyBytes: 64, NodeID: "n2", LeaderOf: followerOf{endpoint: leader.URL}}}
	next := func(http.ResponseWriter, *http.Request) error { t.Fatal("served on a follower"); return nil }
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // as withClientTimeout sets it
	defer cancel()
	r := httptest.NewRequest(http.MethodPost, "/v1/txn/decide", strings.NewReader("{}")).WithContext(ctx)
	r.Header.Set(wire.HeaderTimeout, "2s")
	time.Sleep(50 * time.Millisecond) // time that passes on the follower
	if err := h.leaderOnly(next)(httptest.NewRecorder(), r); err != nil {
		t.Fatal(err)
	}
	left, err := time.ParseDuration(<-got)
	if err != nil || left >= 1950*time.Millisecond || left <= time.Second {
		t.Fatalf("the leader was given %v (%v), want what is left of 2s after 50ms", left, err)
	}
}
