package api

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/raftlockd/raftlockd/cluster"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// The operator endpoints (/v1/cluster/...) and lockd's TC membership
// endpoints (/v1/tc/...).

// Leadership names the current Raft leader.
type Leadership interface {
	Leader() (id, endpoint string)
}

// Cluster is the node's Raft group as operators manage it.
type Cluster interface {
	Leadership
	Status() cluster.Status
	MemberStatuses(ctx context.Context) ([]cluster.MemberStatus, error)
	Leave(ctx context.Context) error
	RemovePeer(ctx context.Context, id string) error
}

// Backups saves and restores the replicated state.
type Backups interface {
	SaveSnapshot(ctx context.Context) (cluster.SnapshotInfo, io.ReadCloser, error)
	Restore(ctx context.Context, r io.Reader) (cluster.RestoreInfo, error)
}

// TCMembership answers lockd's TC leader and membership endpoints.
type TCMembership interface {
	LeaderInfo(ctx context.Context) (cluster.LeaderInfo, error)
	Endpoints() ([]string, time.Time, error)
	MemberByEndpoint(ep string) (string, error)
	LeaveMember(ctx context.Context, id string) error
	MembershipTTL() time.Duration
}

func (h *handler) routeCluster(route func(method, path string, fn func(http.ResponseWriter, *http.Request) error)) {
	if h.Cluster != nil {
		route(http.MethodGet, "/v1/cluster/status", h.clusterStatus)
		route(http.MethodGet, "/v1/cluster/members", h.clusterMembers)
		route(http.MethodPost, "/v1/cluster/leave", h.clusterLeave)
		route(http.MethodPost, "/v1/cluster/remove-peer", h.removePeer)
	}
	if h.Backups != nil {
		route("", "/v1/cluster/snapshot", h.snapshot)
	}
	if h.TC != nil {
		route(http.MethodGet, "/v1/tc/leader", h.tcLeader)
		route(http.MethodGet, "/v1/tc/cluster/list", h.tcList)
		route(http.MethodPost, "/v1/tc/cluster/announce", h.tcAnnounce)
		route(http.MethodPost, "/v1/tc/cluster/leave", h.tcLeave)
	}
}

func (h *handler) clusterStatus(w http.ResponseWriter, r *http.Request) error {
	st := h.Cluster.Status()
	_, endpoint := h.Cluster.Leader()
	writeJSON(w, http.StatusOK, wire.ClusterStatusResponse{NodeID: st.NodeID, RaftAddr: st.RaftAddr, State: st.State,
		LeaderID: st.Leader, LeaderEndpoint: endpoint, LeaderRaftAddr: st.LeaderAddr, Term: st.Term,
		LastIndex: st.LastIndex, LastLogTerm: st.LastLogTerm, CommitIndex: st.CommitIndex,
		AppliedIndex: st.AppliedIndex, LastContactMs: st.LastContactMs, BackendHash: st.BackendHash})
	return nil
}

func (h *handler) clusterMembers(w http.ResponseWriter, r *http.Request) error {
	members, err := h.Cluster.MemberStatuses(r.Context())
	if err != nil {
		return err
	}
	out := wire.ClusterMembersResponse{Members: make([]wire.ClusterMember, 0, len(members))}
	out.LeaderID, out.LeaderEndpoint = h.Cluster.Leader()
	for _, m := range members {
		wm := wire.ClusterMember{ID: m.ID, RaftAddr: m.RaftAddr, APIEndpoint: m.APIEndpoint, GossipStatus: m.Gossip,
			Suffrage: m.Suffrage, Leader: m.Leader}
		if st := m.Status; st != nil {
			wm.Raft = &wire.RaftStatus{State: st.State, Term: st.Term, LastContactMs: st.LastContactMs,
				AppliedIndex: st.AppliedIndex, CommitIndex: st.CommitIndex, LastIndex: st.LastIndex}
		}
		if m.Err != nil {
			wm.Error = m.Err.Error()
		}
		out.Members = append(out.Members, wm)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// clusterLeave makes this node leave; it shuts down once it has answered.
func (h *handler) clusterLeave(w http.ResponseWriter, r *http.Request) error {
	if err := h.decodeJSON(w, r, &struct{}{}); err != nil {
		return err
	}
	if err := h.Cluster.Leave(r.Context()); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.LeaveResponse{Left: true, NodeID: h.NodeID})
	return nil
}

func (h *handler) removePeer(w http.ResponseWriter, r *http.Request) error {
	var req wire.RemovePeerRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if strings.TrimSpace(req.ID) == "" {
		return errcode.InvalidParams.With("id is required")
	}
	if err := h.Cluster.RemovePeer(r.Context(), req.ID); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.RemovePeerResponse{Removed: true, ID: req.ID})
	return nil
}

// snapshot streams a snapshot (GET) or restores one (POST). Transfers of
// large files may take longer than the server's usual request timeouts.
func (h *handler) snapshot(w http.ResponseWriter, r *http.Request) error {
	rc := http.NewResponseController(w)
	switch r.Method {
	case http.MethodGet:
		_ = rc.SetWriteDeadline(time.Time{})
		info, stream, err := h.Backups.SaveSnapshot(r.Context())
		if err != nil {
			return err
		}
		defer stream.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
		w.Header().Set(wire.HeaderSnapshotIndex, strconv.FormatUint(info.Index, 10))
		w.WriteHeader(http.StatusOK)
		if _, err := io.Copy(w, stream); err != nil {
			h.Logger.Warn("streaming a snapshot", "error", err)
		}
		return nil
	case http.MethodPost:
		_ = rc.SetReadDeadline(time.Time{})
		res, err := h.Backups.Restore(r.Context(), r.Body)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, wire.RestoreResponse{Restored: true, Bytes: res.Bytes, Index: res.Index})
		return nil
	}
	w.Header().Set("Allow", "GET, POST")
	return errcode.MethodNotAllowed.With("%s needs GET or POST", r.URL.Path)
}

func (h *handler) tcLeader(w http.ResponseWriter, r *http.Request) error {
	li, err := h.TC.LeaderInfo(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.TCLeaderResponse{LeaderID: li.ID, LeaderEndpoint: li.Endpoint, Term: li.Term,
		ExpiresAt: ceilUnix(li.ExpiresAt)})
	return nil
}

func (h *handler) tcList(w http.ResponseWriter, r *http.Request) error {
	endpoints, updated, err := h.TC.Endpoints()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.TCClusterListResponse{Endpoints: endpoints, UpdatedAt: updated.Unix()})
	return nil
}

// tcAnnounce confirms that self_endpoint belongs to a member. Membership
// itself is managed by gossip and Raft: it lasts while the member is alive
// and for the dead-server timeout after gossip loses it.
func (h *handler) tcAnnounce(w http.ResponseWriter, r *http.Request) error {
	var req wire.TCClusterAnnounceRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if _, err := h.TC.MemberByEndpoint(req.SelfEndpoint); err != nil {
		return err
	}
	endpoints, updated, err := h.TC.Endpoints()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.TCClusterAnnounceResponse{Endpoints: endpoints, UpdatedAt: updated.Unix(),
		ExpiresAt: ceilUnix(time.Now().Add(h.TC.MembershipTTL()))})
	return nil
}

// tcLeave makes the member serving self_endpoint leave the cluster, or this
// node when the body names none (lockd's callers leave themselves).
func (h *handler) tcLeave(w http.ResponseWriter, r *http.Request) error {
	var req wire.TCClusterLeaveRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	id := h.NodeID
	if req.SelfEndpoint != "" {
		var err error
		if id, err = h.TC.MemberByEndpoint(req.SelfEndpoint); err != nil {
			return err
		}
	}
	if err := h.TC.LeaveMember(r.Context(), id); err != nil {
		return err
	}
	endpoints, updated, err := h.TC.Endpoints()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.TCClusterLeaveResponse{Endpoints: endpoints, UpdatedAt: updated.Unix()})
	return nil
}

// ceilUnix is t in Unix seconds, rounded up so that it is never earlier.
func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}
