package cluster

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"

	"github.com/raftlockd/raftlockd/fsm"
)

// pilot is the leader's membership manager: raft-autopilot promotes new
// servers once they are stable and removes servers that stayed dead past
// the threshold without dropping the voters below the island's quorum
// floor; the reconcile loop hands autopilot every server gossip sees alive
// and records the island's voter high-water mark.
//
// Autopilot is started and stopped by one goroutine (run), never by the
// leadership watcher: starting it fetches every alive server's progress,
// which takes up to half a pilot interval when a server is alive in gossip
// but does not answer (a paused or cut-off old leader).
type pilot struct {
	g  *gossip
	ap *autopilot.Autopilot

	mu      sync.Mutex
	want    bool   // this node leads
	wantGen uint64 // bumped on every leadership gain: each term gets its own start
	wake    chan struct{}
	kickCh  chan struct{}
	active  atomic.Bool  // autopilot and the reconcile loop run
	starts  atomic.Int64 // autopilot starts, for tests
	removes atomic.Int64 // failed-server removals in progress
	// fetchGate, when set (tests), holds every fetch of the servers'
	// progress until the channel is closed, past the fetch's own deadline.
	fetchGate atomic.Pointer[chan struct{}]
	// failedSeen counts the times autopilot was told of a failed server.
	failedSeen atomic.Int64

	stateMu sync.Mutex
	state   *autopilot.State
}

func newPilot(g *gossip) *pilot {
	p := &pilot{g: g, kickCh: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
	hl := hclog.New(&hclog.LoggerOptions{Name: "autopilot", Level: hclog.Warn, JSONFormat: true,
		Output: &hclogToSlog{log: g.n.cfg.Logger.With("component", "autopilot")}})
	p.ap = autopilot.New(g.n.raft, p, autopilot.WithLogger(hl),
		autopilot.WithReconcileInterval(g.cfg.PilotInterval), autopilot.WithUpdateInterval(g.cfg.PilotInterval))
	return p
}

// setLeader records whether this node leads; run starts or stops autopilot
// to match. It does not block.
func (p *pilot) setLeader(isLeader bool) {
	p.mu.Lock()
	p.want = isLeader
	if isLeader {
		p.wantGen++
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run starts autopilot for every term this node leads and stops it when
// leadership is lost, in order, until done is closed; then it stops
// autopilot and returns.
func (p *pilot) run(done <-chan struct{}) {
	var cur *pilotTerm
	stop := func() {
		if cur == nil {
			return
		}
		cur.cancel()
		<-p.ap.Stop()
		<-cur.done
		cur = nil
		p.active.Store(false)
	}
	defer stop()
	for {
		select {
		case <-done:
			return
		default:
		}
		p.mu.Lock()
		want, wantGen := p.want, p.wantGen
		p.mu.Unlock()
		if cur != nil && (!want || wantGen != cur.gen) {
			stop()
		}
		if want && cur == nil {
			cur = p.startTerm(wantGen)
		}
		select {
		case <-p.wake:
		case <-done:
			return
		}
	}
}

// pilotTerm is autopilot running for one leadership term.
type pilotTerm struct {
	gen    uint64
	cancel context.CancelFunc
	done   chan struct{} // closed when the reconcile loop has returned
}

func (p *pilot) startTerm(gen uint64) *pilotTerm {
	ctx, cancel := context.WithCancel(context.Background())
	t := &pilotTerm{gen: gen, cancel: cancel, done: make(chan struct{})}
	p.ap.Start(ctx)
	p.starts.Add(1)
	p.active.Store(true)
	go func() {
		defer close(t.done)
		p.reconcileLoop(ctx)
	}()
	return t
}

func (p *pilot) kick() {
	select {
	case p.kickCh <- struct{}{}:
	default:
	}
}

// reconcileLoop adds every alive server that is not yet in the Raft
// configuration (autopilot adds it as a non-voter and promotes it later).
func (p *pilot) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(p.g.cfg.PilotInterval)
	defer t.Stop()
	for {
		p.addNewServers()
		p.recordVoters(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.kickCh:
		}
	}
}

func (p *pilot) addNewServers() {
	p.g.noteRemovals()
	servers, err := p.g.n.Servers()
	if err != nil {
		return
	}
	inConfig := map[raft.ServerID]raft.ServerAddress{}
	for _, s := range servers {
		inConfig[s.ID] = s.Address
	}
	for _, m := range p.g.Members() {
		if m.Status != "alive" || m.RaftAddr == "" || m.meta.Backend != "" && m.meta.Backend != p.g.n.fsm.BackendHash() && p.g.n.fsm.BackendHash() != "" {
			continue
		}
		if _, ok := inConfig[raft.ServerID(m.ID)]; !ok && p.g.wasRemoved(m.ID) {
			continue
		}
		if addr, ok := inConfig[raft.ServerID(m.ID)]; ok && addr == raft.ServerAddress(m.RaftAddr) {
			continue
		}
		if m.meta.Format < fsm.EntryFormat {
			// An older build: the log it would be sent may hold entries
			// it cannot apply (packed ones, drop_waits), and it would stop
			// on them.
			p.g.n.cfg.Logger.Warn("not adding a server of an older build: it cannot apply this cluster's log entries",
				"id", m.ID, "entry_format", m.meta.Format, "want", fsm.EntryFormat)
			continue
		}
		// Only a server that answers over the cluster's own channel (over
		// mutual TLS, when it is on) and is who gossip says it is gets in.
		ctx, cancel := context.WithTimeout(p.g.ctx, 2*time.Second)
		st, err := p.g.n.PeerStatus(ctx, m.RaftAddr)
		cancel()
		if err != nil || st.NodeID != m.ID {
			p.g.n.cfg.Logger.Warn("not adding a server that does not answer as itself on the cluster channel", "id", m.ID,
				"raft", m.RaftAddr, "answered_as", st.NodeID, "error", err)
			continue
		}
		err = p.ap.AddServer(&autopilot.Server{ID: raft.ServerID(m.ID), Name: m.ID, Address: raft.ServerAddress(m.RaftAddr),
			NodeStatus: autopilot.NodeAlive, NodeType: autopilot.NodeVoter, RaftVersion: raft.ProtocolVersionMax})
		if err != nil {
			p.g.n.cfg.Logger.Warn("adding server failed", "id", m.ID, "error", err)
		} else {
			p.g.n.cfg.Logger.Info("added server", "id", m.ID, "raft", m.RaftAddr)
		}
	}
}

// recordVoters raises the island's voter high-water mark to the number of
// voters gossip sees alive, when that is more than recorded; the quorum
// floor every leader uses derives from it.
func (p *pilot) recordVoters(ctx context.Context) {
	servers, err := p.g.n.Servers()
	if err != nil {
		return
	}
	live := 0
	p.g.mu.Lock()
	for _, s := range servers {
		m := p.g.members[string(s.ID)]
		if s.Suffrage == raft.Voter && (s.ID == raft.ServerID(p.g.n.cfg.NodeID) || m != nil && m.Status == "alive") {
			live++
		}
	}
	p.g.mu.Unlock()
	if live <= p.g.n.MaxVoters() {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := p.g.n.proposeLocal(rctx, &fsm.Command{Op: fsm.OpSetBackend, SetBackend: &fsm.SetBackendCmd{Voters: live}}); err != nil {
		p.g.n.cfg.Logger.Warn("recording the voter count", "voters", live, "error", err)
		return
	}
	p.g.n.cfg.Logger.Info("the island's quorum floor rose", "voters", live, "floor", p.g.n.QuorumFloor())
}

// AutopilotConfig implements autopilot.ApplicationIntegration.
func (p *pilot) AutopilotConfig() *autopilot.Config {
	return &autopilot.Config{
		CleanupDeadServers:      true,
		LastContactThreshold:    max(4*p.g.n.cfg.HeartbeatTimeout, time.Second),
		MaxTrailingLogs:         1000,
		MinQuorum:               uint(p.g.n.QuorumFloor()),
		ServerStabilizationTime: p.g.cfg.ServerStabilization,
	}
}

// NotifyState implements autopilot.ApplicationIntegration.
func (p *pilot) NotifyState(s *autopilot.State) {
	p.stateMu.Lock()
	p.state = s
	p.stateMu.Unlock()
}

// State returns autopilot's latest view (leader only; nil otherwise).
func (p *pilot) State() *autopilot.State {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	return p.state
}

// KnownServers implements autopilot.ApplicationIntegration. A server in the
// Raft configuration counts as failed only once it has been dead (or never
// seen alive by this leader) for DeadServerTimeout.
func (p *pilot) KnownServers() map[raft.ServerID]*autopilot.Server {
	p.g.noteRemovals()
	servers, err := p.g.n.Servers()
	if err != nil {
		return nil
	}
	_, leader := p.g.n.raft.LeaderWithID()
	now := time.Now()
	g := p.g
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[raft.ServerID]*autopilot.Server{}
	for _, s := range servers {
		status := autopilot.NodeAlive
		m := g.members[string(s.ID)]
		switch {
		case m == nil:
			since, ok := g.missing[string(s.ID)]
			if !ok {
				since = now
				g.missing[string(s.ID)] = now
			}
			if now.Sub(since) >= g.cfg.DeadServerTimeout {
				status = autopilot.NodeFailed
			}
		case m.Status != "alive" && now.Sub(m.Since) >= g.cfg.DeadServerTimeout:
			status = autopilot.NodeFailed
		}
		out[s.ID] = &autopilot.Server{ID: s.ID, Name: string(s.ID), Address: s.Address, NodeStatus: status,
			NodeType: autopilot.NodeVoter, RaftVersion: raft.ProtocolVersionMax, IsLeader: s.ID == leader}
		if status == autopilot.NodeFailed {
			p.failedSeen.Add(1)
		}
	}
	for id, m := range g.members {
		if _, ok := out[raft.ServerID(id)]; !ok && m.Status == "alive" && !g.removedLocked(id) {
			out[raft.ServerID(id)] = &autopilot.Server{ID: raft.ServerID(id), Name: id, Address: raft.ServerAddress(m.RaftAddr),
				NodeStatus: autopilot.NodeAlive, NodeType: autopilot.NodeVoter, RaftVersion: raft.ProtocolVersionMax}
		}
	}
	return out
}

// FetchServerStats implements autopilot.ApplicationIntegration.
func (p *pilot) FetchServerStats(ctx context.Context, servers map[raft.ServerID]*autopilot.Server) map[raft.ServerID]*autopilot.ServerStats {
	if gate := p.fetchGate.Load(); gate != nil {
		<-*gate
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[raft.ServerID]*autopilot.ServerStats{}
	for id, s := range servers {
		if s.NodeStatus != autopilot.NodeAlive {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := p.g.n.PeerStatus(ctx, string(s.Address))
			if err != nil {
				return
			}
			mu.Lock()
			// A server that never heard from a leader (-1) is unhealthy to autopilot.
			out[id] = &autopilot.ServerStats{LastContact: time.Duration(st.LastContactMs) * time.Millisecond,
				LastTerm: st.LastLogTerm, LastIndex: st.LastIndex}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// RemoveFailedServer implements autopilot.ApplicationIntegration. The
// removal runs on a goroutine the node's Close waits for (and cuts short).
func (p *pilot) RemoveFailedServer(s *autopilot.Server) {
	n := p.g.n
	p.g.mu.Lock()
	m := p.g.members[string(s.ID)]
	var deadRun string
	back := m != nil && m.Status == "alive"
	if m != nil {
		deadRun = m.meta.Run
	}
	p.g.mu.Unlock()
	if back {
		n.cfg.Logger.Info("not removing a failed server that came back", "id", s.ID)
		return
	}
	p.removes.Add(1)
	if !n.spawn(func() {
		defer p.removes.Add(-1)
		ctx, cancel := context.WithTimeout(n.life, 10*time.Second)
		defer cancel()
		if err := n.removeFailed(ctx, string(s.ID), deadRun); err != nil {
			n.cfg.Logger.Warn("removing failed server", "id", s.ID, "error", err)
			return
		}
		n.cfg.Logger.Info("removed failed server", "id", s.ID)
	}) {
		p.removes.Add(-1)
	}
}

func parseUint(s string) uint64 {
	v, _ := strconv.ParseUint(s, 10, 64)
	return v
}
