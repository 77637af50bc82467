package cluster

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/fsm"
)

// leaderLayer is the stream layer of a stand-in leader: it dials as
// servers do (island handshake included) and accepts nothing.
type leaderLayer struct {
	*streamLayer
	done chan struct{}
	once sync.Once
}

func (l *leaderLayer) Accept() (net.Conn, error) { <-l.done; return nil, net.ErrClosed }
func (l *leaderLayer) Close() error              { l.once.Do(func() { close(l.done) }); return nil }
func (l *leaderLayer) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// acquireEntry is a log entry acquiring key.
func acquireEntry(t *testing.T, index, term uint64, key string) *raft.Log {
	t.Helper()
	data, err := fsm.Encode(&fsm.Command{Op: fsm.OpAcquire, Now: time.Now().UnixMilli(), Acquire: &fsm.AcquireCmd{
		Namespace: "default", Key: key, Owner: "o", TxnID: "t-" + key, LeaseID: "l-" + key, RequestID: "r-" + key, TTL: 60_000}})
	if err != nil {
		t.Fatal(err)
	}
	return &raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: data}
}

// A follower holding a deposed leader's entry that no one else has does
// not apply it when a new leader's request matches the log only before it
// and names a commit index beyond: the entry is replaced by the next
// request, not applied and then found replaced.
func TestAFollowerAppliesOnlyWhatTheLeaderProved(t *testing.T) {
	var fatal atomic.Value
	cfg := testConfig(t.TempDir(), "boot-f")
	cfg.NodeID, cfg.Bootstrap = "f", false
	cfg.FSM.Fatal = func(err error) { fatal.Store(err) }
	f, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })

	layer := &leaderLayer{streamLayer: layerOf(peerTLS(), "l"), done: make(chan struct{})}
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: layer, MaxPool: 1, Timeout: 5 * time.Second})
	t.Cleanup(func() { _ = trans.Close() })
	send := func(term, prev, prevTerm, commit uint64, entries ...*raft.Log) {
		t.Helper()
		req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("l"),
			Addr: []byte("127.0.0.1:1")}, Term: term,
			PrevLogEntry: prev, PrevLogTerm: prevTerm, Entries: entries, LeaderCommitIndex: commit}
		var resp raft.AppendEntriesResponse
		if err := trans.AppendEntries("f", raft.ServerAddress(f.RaftAddr()), req, &resp); err != nil || !resp.Success {
			t.Fatalf("append (term %d, after %d): %+v %v", term, prev, resp, err)
		}
	}
	held := func(key string) bool {
		var ok bool
		_ = f.FSM().View(func(v *fsm.View) error {
			rec, _ := v.Key("default", key)
			ok = rec.Lease != nil
			return nil
		})
		return ok
	}

	// Term 1: a leader sends three entries and commits none; the third is
	// its alone.
	send(1, 0, 0, 0, acquireEntry(t, 1, 1, "a"), acquireEntry(t, 2, 1, "b"), acquireEntry(t, 3, 1, "stale"))
	// Term 2: the new leader holds the first two, has committed its own
	// third entry elsewhere, and reaches this server's log at entry 2.
	send(2, 2, 1, 3)
	waitFor(t, 5*time.Second, "the first two entries to be applied", func() bool { return f.FSM().Applied() >= 2 })
	if got := f.FSM().Applied(); got != 2 || held("stale") {
		t.Fatalf("applied %d (the deposed leader's entry held: %v), want 2", got, held("stale"))
	}
	send(2, 2, 1, 3, acquireEntry(t, 3, 2, "fresh"))
	waitFor(t, 5*time.Second, "the new leader's third entry to be applied", func() bool { return f.FSM().Applied() >= 3 })
	if !held("fresh") || held("stale") || fatal.Load() != nil {
		t.Fatalf("fresh held %v, stale held %v, stopped: %v", held("fresh"), held("stale"), fatal.Load())
	}
}
