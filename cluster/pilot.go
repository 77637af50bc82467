package cluster

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
)

// pilot is the leader's membership manager: raft-autopilot promotes new
// servers once they are stable and removes servers that stayed dead past
// the threshold without dropping the voters below the minimum quorum; the
// reconcile loop hands autopilot every server gossip sees alive.
type pilot struct {
	g  *gossip
	ap *autopilot.Autopilot

	mu      sync.Mutex
	cancel  context.CancelFunc
	running chan struct{}
	kickCh  chan struct{}

	stateMu sync.Mutex // not mu: autopilot reports state from inside Start
	state   *autopilot.State
}

func newPilot(g *gossip) *pilot {
	p := &pilot{g: g, kickCh: make(chan struct{}, 1)}
	hl := hclog.New(&hclog.LoggerOptions{Name: "autopilot", Level: hclog.Warn, JSONFormat: true,
		Output: hclogToSlog{log: g.n.cfg.Logger.With("component", "autopilot")}})
	p.ap = autopilot.New(g.n.raft, p, autopilot.WithLogger(hl),
		autopilot.WithReconcileInterval(g.cfg.PilotInterval), autopilot.WithUpdateInterval(g.cfg.PilotInterval))
	return p
}

func (p *pilot) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	done := make(chan struct{})
	p.running = done
	p.ap.Start(ctx)
	go func() {
		defer close(done)
		p.reconcileLoop(ctx)
	}()
}

func (p *pilot) stop() {
	p.mu.Lock()
	cancel, done := p.cancel, p.running
	p.cancel, p.running = nil, nil
	p.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-p.ap.Stop()
	<-done
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
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.kickCh:
		}
	}
}

func (p *pilot) addNewServers() {
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
		err := p.ap.AddServer(&autopilot.Server{ID: raft.ServerID(m.ID), Name: m.ID, Address: raft.ServerAddress(m.RaftAddr),
			NodeStatus: autopilot.NodeAlive, NodeType: autopilot.NodeVoter, RaftVersion: raft.ProtocolVersionMax})
		if err != nil {
			p.g.n.cfg.Logger.Warn("adding server failed", "id", m.ID, "error", err)
		} else {
			p.g.n.cfg.Logger.Info("added server", "id", m.ID, "raft", m.RaftAddr)
		}
	}
}

// AutopilotConfig implements autopilot.ApplicationIntegration.
func (p *pilot) AutopilotConfig() *autopilot.Config {
	return &autopilot.Config{
		CleanupDeadServers:      true,
		LastContactThreshold:    max(4*p.g.n.cfg.HeartbeatTimeout, time.Second),
		MaxTrailingLogs:         1000,
		MinQuorum:               uint(p.g.cfg.MinQuorum),
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
		case m.Status == "dead" && now.Sub(m.Since) >= g.cfg.DeadServerTimeout:
			status = autopilot.NodeFailed
		}
		out[s.ID] = &autopilot.Server{ID: s.ID, Name: string(s.ID), Address: s.Address, NodeStatus: status,
			NodeType: autopilot.NodeVoter, RaftVersion: raft.ProtocolVersionMax, IsLeader: s.ID == leader}
	}
	for id, m := range g.members {
		if _, ok := out[raft.ServerID(id)]; !ok && m.Status == "alive" && !g.removed[id] {
			out[raft.ServerID(id)] = &autopilot.Server{ID: raft.ServerID(id), Name: id, Address: raft.ServerAddress(m.RaftAddr),
				NodeStatus: autopilot.NodeAlive, NodeType: autopilot.NodeVoter, RaftVersion: raft.ProtocolVersionMax}
		}
	}
	return out
}

// FetchServerStats implements autopilot.ApplicationIntegration.
func (p *pilot) FetchServerStats(ctx context.Context, servers map[raft.ServerID]*autopilot.Server) map[raft.ServerID]*autopilot.ServerStats {
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
			out[id] = &autopilot.ServerStats{LastContact: time.Duration(st.LastContactMs) * time.Millisecond,
				LastTerm: st.LastLogTerm, LastIndex: st.LastIndex}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// RemoveFailedServer implements autopilot.ApplicationIntegration.
func (p *pilot) RemoveFailedServer(s *autopilot.Server) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.g.n.removeLocal(ctx, string(s.ID)); err != nil {
			p.g.n.cfg.Logger.Warn("removing failed server", "id", s.ID, "error", err)
			return
		}
		p.g.n.cfg.Logger.Info("removed failed server", "id", s.ID)
	}()
}

func parseUint(s string) uint64 {
	v, _ := strconv.ParseUint(s, 10, 64)
	return v
}
