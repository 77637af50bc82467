package sweeper

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/fsm"
)

// pagedKeys serves a walk of pages of forgettable keys; a full page (Limit
// keys) is followed by the next one.
type pagedKeys struct {
	mu     sync.Mutex
	pages  [][]fsm.KeyName
	afters []string // the after of each call
}

func (p *pagedKeys) ForgettableKeys(after []byte, limit, scan int) ([]fsm.KeyName, []byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.afters = append(p.afters, string(after))
	i := len(p.afters) - 1
	if i >= len(p.pages) {
		return nil, nil, nil
	}
	return p.pages[i], []byte("page" + strconv.Itoa(i)), nil
}

type recordingProposer struct {
	mu   sync.Mutex
	cmds []*fsm.Command
}

func (r *recordingProposer) Propose(_ context.Context, c *fsm.Command) (*fsm.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cmds = append(r.cmds, c)
	return &fsm.Result{Forgotten: len(c.ForgetKeys.Keys)}, nil
}

func (r *recordingProposer) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.cmds)
}

type upgradeFlag struct{ all atomic.Bool }

func (u *upgradeFlag) EveryServerApplies() bool { return u.all.Load() }

func keyNames(n int) []fsm.KeyName {
	out := make([]fsm.KeyName, n)
	for i := range out {
		out[i] = fsm.KeyName{Namespace: "default", Key: "k" + strconv.Itoa(i)}
	}
	return out
}

// The forgetter proposes only on the leader and only once every server
// applies forget_keys; a full entry is followed at once by the next step of
// the walk, which goes on where the last one stopped; its goroutine ends
// with leadership.
func TestForgetterWalksOnTheLeaderOnceEveryServerApplies(t *testing.T) {
	keys := &pagedKeys{pages: [][]fsm.KeyName{keyNames(2), keyNames(2), keyNames(1)}}
	prop, up := &recordingProposer{}, &upgradeFlag{}
	f := NewForgetter(prop, keys, up, ForgetConfig{Interval: 10 * time.Millisecond, Limit: 2})
	defer f.Stop()
	f.SetLeader(true)
	time.Sleep(50 * time.Millisecond) // an older server in the configuration: nothing may happen
	if prop.count() != 0 {
		t.Fatal("proposed forget_keys before every server applies it")
	}
	// Full pages are followed at once: with an hour between partial
	// steps, all three pages are proposed without waiting.
	f.SetLeader(false)
	<-f.Stopped()
	f = NewForgetter(prop, keys, up, ForgetConfig{Interval: time.Hour, Limit: 2})
	defer f.Stop()
	up.all.Store(true)
	f.SetLeader(true)
	for deadline := time.Now().Add(5 * time.Second); prop.count() < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d entries proposed, want 3", prop.count())
		}
	}
	keys.mu.Lock()
	afters := append([]string(nil), keys.afters...)
	keys.mu.Unlock()
	if len(afters) != 3 || afters[0] != "" || afters[1] != "page0" || afters[2] != "page1" {
		t.Fatalf("walk steps started after %q", afters)
	}
	if f.Forgotten() != 5 {
		t.Fatalf("forgotten = %d, want 5", f.Forgotten())
	}
	f.SetLeader(false)
	select {
	case <-f.Stopped():
	case <-time.After(5 * time.Second):
		t.Fatal("the forgetter goroutine outlived leadership")
	}
}
