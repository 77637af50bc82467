package cluster

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
)

// The operator's view of the cluster: who leads, who is a member and how
// far along each one is, and the lockd-style membership list.

// Leader returns the current leader's id and API endpoint, "" when this node
// knows of no leader.
func (n *Node) Leader() (id, endpoint string) {
	_, lid := n.raft.LeaderWithID()
	if lid == "" {
		return "", ""
	}
	return string(lid), n.APIEndpoint(string(lid))
}

// AwaitLeader is Leader after waiting up to LeaderWait for a leader
// (no_leader then).
func (n *Node) AwaitLeader(ctx context.Context) (id, endpoint string, err error) {
	_, lid, err := n.awaitLeader(ctx)
	if err != nil {
		return "", "", err
	}
	return string(lid), n.APIEndpoint(string(lid)), nil
}

// LeaderInfo describes the leader as lockd's /v1/tc/leader reports it.
type LeaderInfo struct {
	ID       string
	Endpoint string
	Term     uint64
	// ExpiresAt is how long the leadership is known to last without news:
	// on the leader, the leader lease (it steps down when a quorum has not
	// answered for that long); on a follower, the heartbeat timeout after
	// the leader was last heard (it starts an election then).
	ExpiresAt time.Time
}

// LeaderInfo returns the current leader, waiting up to LeaderWait for one.
func (n *Node) LeaderInfo(ctx context.Context) (LeaderInfo, error) {
	_, id, err := n.awaitLeader(ctx)
	if err != nil {
		return LeaderInfo{}, err
	}
	li := LeaderInfo{ID: string(id), Endpoint: n.APIEndpoint(string(id)), Term: n.raft.CurrentTerm()}
	if id == raft.ServerID(n.cfg.NodeID) {
		li.ExpiresAt = time.Now().Add(n.cfg.LeaderLeaseTimeout)
	} else {
		last := n.raft.LastContact()
		if last.IsZero() {
			last = time.Now()
		}
		li.ExpiresAt = last.Add(n.cfg.HeartbeatTimeout)
	}
	return li, nil
}

// Suffrage of a server in MemberStatus.
const (
	SuffrageVoter    = "voter"
	SuffrageNonvoter = "nonvoter"
	SuffrageNone     = "none" // known to gossip, not in the Raft configuration
)

// MemberStatus is one server as the operator sees it: its place in the Raft
// configuration, what gossip says about it and its own report of its Raft
// progress (Err when it could not be asked).
type MemberStatus struct {
	ID          string
	RaftAddr    string
	APIEndpoint string
	Gossip      string // alive, dead or unknown
	Suffrage    string
	Leader      bool
	Status      *Status
	Err         error
}

// MemberStatuses lists every server of the Raft configuration and every
// server gossip knows, sorted by id, each with the status it reports itself.
// A server that does not answer within a couple of seconds has Err set; it
// does not fail the call.
func (n *Node) MemberStatuses(ctx context.Context) ([]MemberStatus, error) {
	servers, err := n.Servers()
	if err != nil {
		return nil, err
	}
	_, leader := n.raft.LeaderWithID()
	byID := map[string]*MemberStatus{}
	var out []*MemberStatus
	add := func(id string) *MemberStatus {
		if m := byID[id]; m != nil {
			return m
		}
		m := &MemberStatus{ID: id, Gossip: "unknown", Suffrage: SuffrageNone, Leader: id == string(leader)}
		byID[id] = m
		out = append(out, m)
		return m
	}
	for _, s := range servers {
		m := add(string(s.ID))
		m.RaftAddr = string(s.Address)
		m.Suffrage = SuffrageNonvoter
		if s.Suffrage == raft.Voter {
			m.Suffrage = SuffrageVoter
		}
	}
	for _, g := range n.Members() {
		m := add(g.ID)
		m.Gossip, m.APIEndpoint = g.Status, g.API
		if m.RaftAddr == "" {
			m.RaftAddr = g.RaftAddr
		}
	}
	if m := byID[n.cfg.NodeID]; m != nil && m.APIEndpoint == "" {
		m.APIEndpoint = n.APIEndpoint(n.cfg.NodeID)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, m := range out {
		if m.RaftAddr == "" {
			m.Err = errcode.Unavailable.With("no Raft address known")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := n.PeerStatus(ctx, m.RaftAddr)
			switch {
			case err != nil:
				m.Err = err
			case st.NodeID != m.ID:
				// Another process now listens there (the server moved, or
				// one started on its address): its Raft state is not this
				// server's.
				m.Err = errcode.Unavailable.With("%s answers as %s", m.RaftAddr, st.NodeID)
			case !sameIsland(st.BackendHash, n.fsm.BackendHash()):
				m.Err = errcode.Unavailable.With("%s belongs to another island (backend %s): its data directory "+
					"was copied or restored from another cluster", m.ID, st.BackendHash)
			default:
				m.Status = &st
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b *MemberStatus) int { return strings.Compare(a.ID, b.ID) })
	res := make([]MemberStatus, len(out))
	for i, m := range out {
		res[i] = *m
	}
	return res, nil
}

// Endpoints lists the API endpoints of the servers in the Raft
// configuration that gossip sees alive, sorted, and when gossip last saw
// the membership change.
func (n *Node) Endpoints() ([]string, time.Time, error) {
	servers, err := n.Servers()
	if err != nil {
		return nil, time.Time{}, err
	}
	members := map[string]Member{}
	var updated time.Time
	for _, m := range n.Members() {
		members[m.ID] = m
		if m.Since.After(updated) {
			updated = m.Since
		}
	}
	endpoints := []string{}
	for _, s := range servers {
		if m, ok := members[string(s.ID)]; ok && m.Status == "alive" && m.API != "" {
			if ep, err := NormalizeEndpoint(m.API); err == nil {
				m.API = ep
			}
			endpoints = append(endpoints, m.API)
		}
	}
	slices.Sort(endpoints)
	if updated.IsZero() {
		updated = time.Now()
	}
	return endpoints, updated, nil
}

// NormalizeEndpoint checks that ep is an http(s) URL of a server and returns
// it in the form the members publish (lower-case scheme and host, without
// the scheme's default port, no trailing slash), so that https://h and
// https://h:443 are one endpoint; anything else is invalid_endpoint.
func NormalizeEndpoint(ep string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(ep))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil ||
		u.RawQuery != "" || u.Fragment != "" || strings.Trim(u.Path, "/") != "" || !validPort(u.Port()) {
		return "", errcode.InvalidEndpoint.With("%q is not the http(s) URL of a server", ep)
	}
	scheme, host := strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	if port := u.Port(); port == "443" && scheme == "https" || port == "80" && scheme == "http" {
		host = strings.TrimSuffix(host, ":"+port)
	}
	return scheme + "://" + host, nil
}

// validPort reports whether port is empty (the scheme's) or 1-65535.
func validPort(port string) bool {
	if port == "" {
		return true
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535
}

// MemberByEndpoint returns the id of the server in the Raft configuration
// whose API endpoint is ep: invalid_endpoint when ep is not a server URL,
// not_found when no member publishes it.
func (n *Node) MemberByEndpoint(ep string) (string, error) {
	want, err := NormalizeEndpoint(ep)
	if err != nil {
		return "", err
	}
	servers, err := n.Servers()
	if err != nil {
		return "", err
	}
	for _, s := range servers {
		if api := n.APIEndpoint(string(s.ID)); api != "" {
			if got, err := NormalizeEndpoint(api); err == nil && got == want {
				return string(s.ID), nil
			}
		}
	}
	return "", errcode.NotFound.With("no member of the cluster serves %s", ep)
}

// MembershipTTL is how long a member stays in the cluster without news of
// it: the leader removes a server that gossip has seen dead for this long.
func (n *Node) MembershipTTL() time.Duration {
	if n.gossip == nil {
		return time.Minute
	}
	return n.gossip.cfg.DeadServerTimeout
}

// LeaveMember makes server id leave the cluster gracefully: this node
// leaves itself, another member is asked over the cluster port. Either way
// the departing node shuts down afterwards.
func (n *Node) LeaveMember(ctx context.Context, id string) error {
	if id == n.cfg.NodeID {
		return n.Leave(ctx)
	}
	servers, err := n.Servers()
	if err != nil {
		return err
	}
	var addr string
	for _, s := range servers {
		if string(s.ID) == id {
			addr = string(s.Address)
		}
	}
	if addr == "" {
		return errcode.NotFound.With("server %s is not a member", id)
	}
	var reply LeaveReply
	callErr := n.peers.call(ctx, addr, "Leave", LeaveArgs{Deadline: deadlineOf(ctx), Timeout: timeoutOf(ctx)}, &reply)
	if callErr == nil {
		if reply.Err != nil {
			return reply.Err
		}
		return nil
	}
	// The departing node shuts down right after answering; its answer may
	// be lost with the connection. It left if it is no longer a member.
	var nd notDelivered
	if errors.As(callErr, &nd) {
		return callErr
	}
	for range 20 {
		if servers, err := n.Servers(); err == nil && !slices.ContainsFunc(servers, func(s raft.Server) bool { return string(s.ID) == id }) {
			return nil
		}
		if !sleepCtx(ctx, n.done, 100*time.Millisecond) {
			break
		}
	}
	return callErr
}
