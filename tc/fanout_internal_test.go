package tc

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

func TestBackoffGrowsToItsCapWithFullJitter(t *testing.T) {
	b := backoff{bound: 10 * time.Millisecond, max: 50 * time.Millisecond, multiplier: 2}
	for i, bound := range []time.Duration{10, 20, 40, 50, 50} {
		if d := b.next(); d < 0 || d > bound*time.Millisecond {
			t.Fatalf("wait %d: %s, want within [0, %dms]", i, d, bound)
		}
	}
	// Full jitter: the waits spread over [0, bound], they are not the bound.
	low := 0
	for range 200 {
		if b.next() < 25*time.Millisecond {
			low++
		}
	}
	if low == 0 || low == 200 {
		t.Fatalf("%d of 200 waits were below half the bound", low)
	}
	// A multiplier whose product overflows a duration reaches the cap.
	huge := backoff{bound: 2 * time.Second, max: 2 * time.Second, multiplier: 1e12}
	for range 3 {
		if d := huge.next(); d < 0 || d > 2*time.Second {
			t.Fatalf("wait %s with a huge multiplier", d)
		}
	}
}

// readStore serves reads from a real state machine; the coordinator under
// test proposes nothing.
type readStore struct{ f *fsm.FSM }

func (s readStore) Propose(context.Context, *fsm.Command) (*fsm.Result, error) {
	return nil, errors.New("not proposing")
}

func (s readStore) Read(_ context.Context, fn func(v *fsm.View) error) error { return s.f.View(fn) }

func islandWithEndpoints(t *testing.T, backend string, endpoints ...string) readStore {
	t.Helper()
	f := openFSM(t)
	var logs []*raft.Log
	for i, ep := range endpoints {
		data, err := fsm.Encode(&fsm.Command{Op: fsm.OpRMRegister, Now: 1_000,
			RMRegister: &fsm.RMRegisterCmd{Backend: backend, Endpoint: ep}})
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, &raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: data})
	}
	for _, r := range f.ApplyBatch(logs) {
		if res, _ := r.(*fsm.Result); res == nil || res.Err != nil {
			t.Fatalf("register: %+v", r)
		}
	}
	return readStore{f: f}
}

// atIsland makes FanoutAttempts attempts at a transient failure, over every
// endpoint in turn, and stops at once on success or a permanent failure.
func TestAtIslandRetriesTransientFailuresOnly(t *testing.T) {
	eps := []string{"https://a.example:1", "https://b.example:1", "https://c.example:1"}
	c := New(islandWithEndpoints(t, "island", eps...), nil, nil, nil, Config{FanoutAttempts: 5,
		FanoutBaseDelay: time.Millisecond, FanoutMaxDelay: 2 * time.Millisecond, FanoutTimeout: time.Second})
	ctx := context.Background()
	run := func(fail func(attempt int) error) (int, map[string]int, error) {
		calls, seen := 0, map[string]int{}
		err := c.atIsland(ctx, "island", func(_ context.Context, ep string) error {
			calls++
			seen[ep]++
			return fail(calls)
		})
		return calls, seen, err
	}

	calls, seen, err := run(func(int) error { return errors.New("connection refused") })
	if calls != 5 || len(seen) != 3 {
		t.Fatalf("transient failures: %d attempts over %v, want 5 over every endpoint", calls, seen)
	}
	var e *errcode.Error
	if !errors.As(err, &e) || e.Code != errcode.TxnUnreachable.Code || e.RetryAfter == 0 {
		t.Fatalf("an island that never answered: %v", err)
	}

	calls, _, err = run(func(n int) error {
		if n < 3 {
			return &client.Error{Status: http.StatusServiceUnavailable, Envelope: &errcode.Error{Code: errcode.NoLeader.Code}}
		}
		return nil
	})
	if calls != 3 || err != nil {
		t.Fatalf("success on the third attempt: %d attempts, %v", calls, err)
	}

	calls, _, err = run(func(int) error {
		return &client.Error{Status: http.StatusConflict, Envelope: &errcode.Error{Code: errcode.TxnLockConflict.Code, Detail: "LOCKED:x"}}
	})
	if calls != 1 || !errors.As(err, &e) || e.Code != errcode.TxnLockConflict.Code || e.Detail != "LOCKED:x" {
		t.Fatalf("a permanent failure: %d attempts, %v", calls, err)
	}

	err = c.atIsland(ctx, "unknown", func(context.Context, string) error { return nil })
	if !errors.As(err, &e) || e.Code != errcode.TxnUnreachable.Code {
		t.Fatalf("an island without endpoints: %v", err)
	}
}

// openFSM opens a state machine in a temporary directory, closed when the
// test ends.
func openFSM(t *testing.T) *fsm.FSM {
	t.Helper()
	f, err := fsm.Open(filepath.Join(t.TempDir(), "state.db"), fsm.Options{BootID: "b",
		Fatal: func(err error) { t.Fatalf("unexpected fatal: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}
