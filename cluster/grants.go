package cluster

import (
	"context"
	"time"

	"github.com/raftlockd/raftlockd/fsm"
)

// Grant push. An acquirer (or a dequeue) waits on the server that received
// its request and learns of its grant (or delivery) from the event that
// server's state machine publishes when it applies the step that freed the
// key (or made a message ready). A follower applies
// that step only after the leader's next AppendEntries tells it the step
// committed, which with nothing else to write is a commit timeout later.
// The leader therefore sends the grants it applies for acquirers waiting on
// other servers to those servers at once. A pushed grant is committed (the
// leader applied it), so the waiting request may answer with it; the
// server's own state machine publishes the same grant again later, which
// finds nobody waiting.

// GrantsArgs carries grants for acquirers waiting on the receiving server.
type GrantsArgs struct{ Events []fsm.Event }

// GrantsReply acknowledges pushed grants.
type GrantsReply struct{}

// grantPusher observes the leader's applied batches and pushes the grants
// meant for other servers.
type grantPusher struct {
	n     *Node
	queue chan []fsm.Event
}

func newGrantPusher(n *Node) *grantPusher {
	return &grantPusher{n: n, queue: make(chan []fsm.Event, 256)}
}

// Observe implements fsm.Observer. It runs on the apply goroutine and never
// blocks: when the queue is full the servers learn of their grants by
// applying the entries themselves.
func (g *grantPusher) Observe(events []fsm.Event) {
	if !g.n.leader.Load() {
		return
	}
	var out []fsm.Event
	for _, e := range events {
		if (e.Kind == fsm.EventGranted || e.Kind == fsm.EventDelivered) && e.Node != "" && e.Node != g.n.cfg.NodeID {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return
	}
	select {
	case g.queue <- out:
	default:
	}
}

// run delivers queued grants until the node closes.
func (g *grantPusher) run() {
	for {
		select {
		case <-g.n.life.Done():
			return
		case events := <-g.queue:
			g.push(events)
		}
	}
}

func (g *grantPusher) push(events []fsm.Event) {
	byNode := map[string][]fsm.Event{}
	for _, e := range events {
		byNode[e.Node] = append(byNode[e.Node], e)
	}
	servers, err := g.n.Servers()
	if err != nil {
		return
	}
	for _, s := range servers {
		batch := byNode[string(s.ID)]
		if len(batch) == 0 {
			continue
		}
		addr := string(s.Address)
		g.n.spawn(func() {
			ctx, cancel := context.WithTimeout(g.n.life, time.Second)
			defer cancel()
			var reply GrantsReply
			if err := g.n.peers.call(ctx, addr, "Grants", GrantsArgs{Events: batch}, &reply); err != nil {
				g.n.cfg.Logger.Debug("pushing grants", "to", addr, "error", err)
				return
			}
			g.n.metrics.grantsPushed.Add(float64(len(batch)))
		})
	}
}

// Grants hands grants pushed by the leader to the requests waiting here.
func (s *rpcService) Grants(args GrantsArgs, _ *GrantsReply) error {
	if o := s.n.cfg.Grants; o != nil {
		o.Observe(args.Events)
	}
	return nil
}
