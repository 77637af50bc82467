package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A heartbeat raft is handling when the node shuts the gate is waited for;
// one arriving later never reaches raft.
func TestShutGateWaitsForHeartbeatsAndDropsLaterOnes(t *testing.T) {
	inner, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	recv := newRaftTransport(inner, false)
	sender, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()

	entered, release := make(chan struct{}, 4), make(chan struct{})
	recv.SetHeartbeatHandler(func(rpc raft.RPC) {
		entered <- struct{}{}
		<-release
		rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
	})
	heartbeat := func() <-chan error {
		errc := make(chan error, 1)
		go func() {
			req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(sender.LocalAddr())}, Term: 1}
			errc <- sender.AppendEntries("recv", recv.LocalAddr(), req, &raft.AppendEntriesResponse{})
		}()
		return errc
	}
	first := heartbeat()
	waitRecv(t, entered, "the first heartbeat to reach raft")

	shut := make(chan struct{})
	go func() { recv.shutHeartbeats(); close(shut) }()
	select {
	case <-shut:
		t.Fatal("the gate shut while raft was still handling a heartbeat")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	waitRecv(t, shut, "the gate to shut once the heartbeat was handled")
	if err := <-first; err != nil {
		t.Fatalf("the heartbeat handled before the gate shut: %v", err)
	}

	second := heartbeat()
	if err := recv.Close(); err != nil { // as raft's Shutdown does
		t.Fatal(err)
	}
	select {
	case err := <-second:
		if err == nil {
			t.Fatal("a heartbeat after the gate shut was answered")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a heartbeat after the gate shut is still waiting after the transport closed")
	}
	select {
	case <-entered:
		t.Fatal("a heartbeat after the gate shut reached raft")
	default:
	}
}

func waitRecv(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// loopbackTransport is a raftTransport on a loopback port, closed when the
// test ends.
func loopbackTransport(t *testing.T) *raftTransport {
	t.Helper()
	inner, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	tr := newRaftTransport(inner, false)
	t.Cleanup(func() { tr.Close() })
	return tr
}

// Raft replicates without a pipeline: its pipelined replication can
// deadlock (see raftTransport).
func TestTransportOffersNoPipeline(t *testing.T) {
	tr := loopbackTransport(t)
	if _, err := tr.AppendEntriesPipeline("peer", "127.0.0.1:1"); !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		t.Fatalf("a pipeline was offered: %v", err)
	}
}

// A server that gossip announces as a build from before the island check
// is dialled as it expects; any other names its island first.
func TestRaftDialsAServerOfAnOlderBuildAsItExpects(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan byte, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var b [1]byte
			if _, err := io.ReadFull(c, b[:]); err == nil {
				seen <- b[0]
			}
			if b[0] == protoRaftIsland {
				if _, _, err := readIsland(c); err == nil {
					_ = writeIsland(c, "abc", "peer")
				}
			}
			c.Close()
		}
	}()
	older := false
	s := &streamLayer{m: &mux{island: func() string { return "abc" }}, network: TCP{}, older: func(string) bool { return older }}
	for _, o := range []bool{false, true} {
		older = o
		c, err := s.Dial(raft.ServerAddress(ln.Addr().String()), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	var got []byte
	for len(got) < 2 {
		select {
		case b := <-seen:
			got = append(got, b)
		case <-time.After(10 * time.Second):
			t.Fatalf("the server saw %q", got)
		}
	}
	if string(got) != "IR" {
		t.Fatalf("the server saw %q, want an island hello, then Raft as an older build expects", got)
	}
}

// A replication request that does not reach its server is sent again for
// as long as raft would send it (wanted), and answered with its error once
// raft no longer would, or once the transport closes.
func TestAnUnreachedRequestIsSentAgainWhileRaftWantsIt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := raft.ServerAddress(ln.Addr().String())
	ln.Close() // nothing listens there: every dial is refused
	tr := loopbackTransport(t)
	var asked atomic.Int32
	tr.setWanted(func(id raft.ServerID, term uint64) bool {
		if id != "peer" || term != 7 {
			t.Errorf("asked about %s in term %d", id, term)
		}
		return asked.Add(1) < 5
	})
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(tr.LocalAddr())}, Term: 7}
	start := time.Now()
	err = tr.AppendEntries("peer", down, req, &raft.AppendEntriesResponse{})
	if !unreached(err) || asked.Load() != 5 || time.Since(start) < 4*retryEvery {
		t.Fatalf("answered %v after %d questions in %v", err, asked.Load(), time.Since(start))
	}

	tr.setWanted(func(raft.ServerID, uint64) bool { return true })
	errc := make(chan error, 1)
	go func() { errc <- tr.AppendEntries("peer", down, req, &raft.AppendEntriesResponse{}) }()
	select {
	case err := <-errc:
		t.Fatalf("answered while raft wants it sent: %v", err)
	case <-time.After(5 * retryEvery):
	}
	tr.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a request that never reached its server succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a closed transport still sends the request")
	}
}

// The transport keeps the latest commit index a leader sent, or the index
// of the snapshot it installs, newest term first.
func TestTheTransportNotesHowFarTheLeaderIs(t *testing.T) {
	tr := loopbackTransport(t)
	for _, c := range []struct {
		cmd  any
		want leaderCommit
	}{
		{&raft.AppendEntriesRequest{Term: 3, LeaderCommitIndex: 120}, leaderCommit{3, 120}},
		{&raft.InstallSnapshotRequest{Term: 3, LastLogIndex: 500}, leaderCommit{3, 500}},
		{&raft.AppendEntriesRequest{Term: 3, LeaderCommitIndex: 400}, leaderCommit{3, 500}},
		{&raft.RequestVoteRequest{Term: 4}, leaderCommit{3, 500}},
		{&raft.AppendEntriesRequest{Term: 4, LeaderCommitIndex: 450}, leaderCommit{4, 450}},
	} {
		tr.noteCommit(raft.RPC{Command: c.cmd})
		if got := tr.commit.Load(); got == nil || *got != c.want {
			t.Fatalf("after %T: %+v, want %+v", c.cmd, got, c.want)
		}
	}
}

// A Raft address that answers as this very server is the stale address of
// another one (containers restarted with each other's addresses): raft
// never dials itself, and a connection to itself would let a candidate
// grant itself that peer's vote (raft grants a repeated request of the
// candidate it voted for) and be elected alone. Both ends refuse it.
func TestRaftRefusesToDialItself(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := newMux(ln, func(c net.Conn) { c.Close() }, "node1", func() string { return "abc" }, nil,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer m.close()
	go func() {
		for {
			select {
			case c := <-m.raftCh:
				c.Close()
			case <-m.done:
				return
			}
		}
	}()
	s := &streamLayer{m: m, network: TCP{}}
	c, err := s.Dial(raft.ServerAddress(ln.Addr().String()), 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatal("raft dialled its own server at another server's address")
	}
	if !errors.Is(err, ErrDialledSelf) {
		t.Fatalf("dialling itself: %v, want ErrDialledSelf", err)
	}
}

// A dial that reached another server, or this one, at a server's address
// (an address it no longer has) did not reach that server: AppendEntries
// tries again shortly, by when its new address may be known.
func TestAStaleAddressCountsAsUnreached(t *testing.T) {
	for _, err := range []error{ErrOtherServer, ErrDialledSelf} {
		if !unreached(fmt.Errorf("cluster: dial 127.0.0.1:1: %w", err)) {
			t.Errorf("%v does not count as unreached", err)
		}
	}
	if unreached(fmt.Errorf("cluster: dial: %w", ErrOtherIsland)) {
		t.Error("another island's server counts as unreached")
	}
}

// appendSender sends AppendEntries requests to recv as a leader's raft
// does, and returns what raft at recv was handed of each.
func appendSender(t *testing.T, recv *raftTransport) func(req *raft.AppendEntriesRequest) *raft.AppendEntriesRequest {
	sender, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sender.CloseStreams() // the pooled connections, which Close leaves open
		sender.Close()
	})
	return func(req *raft.AppendEntriesRequest) *raft.AppendEntriesRequest {
		t.Helper()
		errc := make(chan error, 1)
		go func() {
			var resp raft.AppendEntriesResponse
			errc <- sender.AppendEntries("n2", recv.LocalAddr(), req, &resp)
		}()
		var got *raft.AppendEntriesRequest
		select {
		case rpc := <-recv.Consumer():
			got = rpc.Command.(*raft.AppendEntriesRequest)
			rpc.Respond(&raft.AppendEntriesResponse{Term: req.Term, Success: true}, nil)
		case <-time.After(5 * time.Second):
			t.Fatal("the request did not reach raft")
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		return got
	}
}

// A follower far behind gets its missing entries a batch at a time: raft
// is handed the commit index the batch proves (clampCommit), but how far
// the follower has to catch up (noteCommit, /readyz) is the leader's.
func TestAFollowerCatchingUpKnowsTheLeadersCommit(t *testing.T) {
	recv := loopbackTransport(t)
	send := appendSender(t, recv)
	entries := make([]*raft.Log, 256)
	for i := range entries {
		entries[i] = &raft.Log{Index: uint64(101 + i), Term: 2, Type: raft.LogCommand}
	}
	handed := send(&raft.AppendEntriesRequest{Term: 2, PrevLogEntry: 100, PrevLogTerm: 2, Entries: entries, LeaderCommitIndex: 50_000})
	if handed.LeaderCommitIndex != 356 {
		t.Fatalf("raft is handed commit index %d, want the batch's last entry 356", handed.LeaderCommitIndex)
	}
	if got := recv.commit.Load(); got == nil || *got != (leaderCommit{term: 2, index: 50_000}) {
		t.Fatalf("noted %+v, want the leader's commit index 50000 in term 2", got)
	}
}

// A heartbeat carries no commit index (raft sends it as an AppendEntries
// request with none): a server that restarted and so far only heard
// heartbeats does not know how far the leader is, and one that knew keeps
// what it knew.
func TestAHeartbeatTellsNothingOfTheLeadersCommit(t *testing.T) {
	recv := loopbackTransport(t)
	send := appendSender(t, recv)
	// What raft's heartbeat sends.
	heartbeat := func(term uint64) *raft.AppendEntriesRequest {
		return &raft.AppendEntriesRequest{Term: term, Leader: []byte("leader")}
	}
	send(heartbeat(3))
	if got := recv.commit.Load(); got != nil {
		t.Fatalf("after a heartbeat only: noted %+v, want nothing", got)
	}
	send(&raft.AppendEntriesRequest{Term: 3, PrevLogEntry: 900, PrevLogTerm: 3, LeaderCommitIndex: 900})
	send(heartbeat(4))
	if got := recv.commit.Load(); got == nil || *got != (leaderCommit{term: 3, index: 900}) {
		t.Fatalf("after a heartbeat of a newer term: noted %+v, want {3 900}", got)
	}
}
