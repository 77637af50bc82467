package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/raftlockd/raftlockd/cluster"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/rm"
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
	Running(ctx context.Context, id string) bool
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
		AppliedIndex: st.AppliedIndex, LastContactMs: st.LastContactMs, BackendHash: st.BackendHash, Joining: st.Joining})
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
				AppliedIndex: st.AppliedIndex, CommitIndex: st.CommitIndex, LastIndex: st.LastIndex, Joining: st.Joining}
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
	writeJSON(w, http.StatusOK, wire.RemovePeerResponse{Removed: true, ID: req.ID, Running: h.Cluster.Running(r.Context(), req.ID)})
	return nil
}

// snapshot streams a snapshot (GET; HEAD answers its headers) or restores
// one (POST). Transfers of large files may take longer than the server's
// usual request timeouts.
func (h *handler) snapshot(w http.ResponseWriter, r *http.Request) error {
	rc := http.NewResponseController(w)
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		_ = rc.SetWriteDeadline(time.Time{})
		info, stream, err := h.Backups.SaveSnapshot(r.Context())
		if err != nil {
			return err
		}
		defer stream.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
		w.Header().Set(wire.HeaderSnapshotIndex, strconv.FormatUint(info.Index, 10))
		w.Header().Set(wire.HeaderSnapshotSHA256, info.SHA256)
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return nil
		}
		if _, err := io.Copy(w, stream); err != nil {
			h.Logger.Warn("streaming a snapshot", "error", err)
		}
		return nil
	case http.MethodPost:
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		return h.restore(w, r)
	}
	w.Header().Set("Allow", "GET, HEAD, POST")
	return errcode.MethodNotAllowed.With("%s needs GET (or HEAD) or POST", r.URL.Path)
}

// restoreForwards bounds how often a follower asks again who leads when the
// node it forwarded an upload to stopped leading before reading any of it.
const restoreForwards = 4

// restoreForwarder carries uploads from a follower to the leader's API,
// with the TLS settings of PeerHTTP (the node's certificate). It keeps no
// idle connections (restores are rare) and uses no proxy from the
// environment: the peers' endpoints are internal addresses.
func (h *handler) restoreForwarder() *http.Client {
	t := &http.Transport{
		DialContext:       (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		DisableKeepAlives: true,
		// The leader answers 100 Continue once it starts storing the upload,
		// or refuses it (not_leader) without reading it.
		ExpectContinueTimeout: 30 * time.Second,
	}
	if peer, ok := h.peerHTTP().Transport.(*http.Transport); ok {
		t.TLSClientConfig, t.DialTLSContext = peer.TLSClientConfig, peer.DialTLSContext
		if peer.DialContext != nil {
			t.DialContext = peer.DialContext // with mTLS: no peer over plain http
		}
	}
	return &http.Client{Transport: t}
}

// restore installs an uploaded snapshot. Only the leader restores; a
// follower forwards the upload to the leader's API endpoint itself,
// streaming it as it arrives, so that clients need not reach the leader's
// advertised address (a container's host name, a private network). The
// leader checks a forwarded upload exactly as one it receives directly.
//
// An upload sent with X-Expected-SHA256 is restored only when its bytes
// have that checksum; otherwise nothing changes (409
// expected_sha256_mismatch). A follower passes the header on.
func (h *handler) restore(w http.ResponseWriter, r *http.Request) error {
	want := strings.TrimSpace(r.Header.Get(wire.HeaderExpectedSHA256))
	if want != "" && !rm.ValidSHA256(want) {
		return errcode.InvalidChecksum.With("%s must be 64 hex digits", wire.HeaderExpectedSHA256)
	}
	body := &uploadBody{r: r.Body}
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		res, err := h.Backups.Restore(r.Context(), checked(body, want))
		if err == nil {
			writeJSON(w, http.StatusOK, wire.RestoreResponse{Restored: true, Bytes: res.Bytes, Index: res.Index})
			return nil
		}
		var e *errcode.Error
		if !errors.As(err, &e) || e.Code != errcode.NotLeader.Code || e.LeaderEndpoint == "" ||
			r.Header.Get(wire.HeaderForwardedBy) != "" || body.used() {
			return err
		}
		err = h.forwardRestore(w, r, body, e.LeaderEndpoint)
		var again *forwardAgain
		if !errors.As(err, &again) {
			return err
		}
		if attempt == restoreForwards {
			ue := errcode.Unavailable.With("forwarding the snapshot to the leader: %v", again.why)
			ue.RetryAfter = 1
			return ue
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return fmt.Errorf("api: forward restore: %w", r.Context().Err())
		}
		backoff *= 2
	}
}

// forwardAgain is forwardRestore's report that nothing was sent and
// nothing answered: the node asked may try again, naming the leader anew.
type forwardAgain struct{ why string }

func (f *forwardAgain) Error() string { return f.why }

// forwardRestore sends the upload to the leader at endpoint and relays its
// answer. It returns a *forwardAgain, with nothing written, when the upload
// did not reach a leader and none of it was read: the node there no longer
// leads, or could not be reached.
func (h *handler) forwardRestore(w http.ResponseWriter, r *http.Request, body *uploadBody, endpoint string) error {
	target := strings.TrimRight(endpoint, "/") + "/v1/cluster/snapshot"
	var rd io.Reader = body
	if r.ContentLength == 0 {
		rd = http.NoBody
	}
	// A leader that stops answering in the middle of the upload (a paused
	// process, a cut network) is not waited for past its successor's
	// election.
	ctx := r.Context()
	if h.LeaderOf != nil {
		id, current := h.LeaderOf.Leader()
		if id == "" || current != endpoint {
			return &forwardAgain{why: fmt.Sprintf("%s no longer leads", endpoint)}
		}
		var done context.CancelFunc
		ctx, done = h.LeaderOf.WhileLeads(ctx, id)
		defer done()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, rd)
	if err != nil {
		return &forwardAgain{why: fmt.Sprintf("the leader's endpoint %q: %v", endpoint, err)}
	}
	req.ContentLength = r.ContentLength
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Expect", "100-continue")
	req.Header.Set(wire.HeaderForwardedBy, h.NodeID)
	if v := r.Header.Get(wire.HeaderExpectedSHA256); v != "" {
		req.Header.Set(wire.HeaderExpectedSHA256, v)
	}
	if id := correlation(r.Context()); id != "" {
		req.Header.Set(wire.HeaderCorrelationID, id)
	}
	start := time.Now()
	resp, err := h.restoreForwarder().Do(req)
	if err != nil {
		if ctxErr := r.Context().Err(); ctxErr != nil {
			return fmt.Errorf("api: forward restore to %s: %w", endpoint, ctxErr)
		}
		if !body.used() {
			// Nothing was sent: asking again who leads is safe.
			h.Logger.Warn("forwarding a snapshot restore", "leader", endpoint, "error", err)
			return &forwardAgain{why: fmt.Sprintf("%s: %v", endpoint, err)}
		}
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		ue := errcode.Unavailable.With("forwarding the snapshot to the leader at %s failed after %d bytes: %v",
			endpoint, body.bytes(), err)
		ue.RetryAfter = 1
		return ue
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		ue := errcode.Unavailable.With("reading the leader's answer to the restore: %v", err)
		ue.RetryAfter = 1
		return ue
	}
	if resp.StatusCode != http.StatusOK {
		var e errcode.Error
		if json.Unmarshal(raw, &e) == nil && e.Code == errcode.NotLeader.Code {
			if !body.used() {
				return &forwardAgain{why: fmt.Sprintf("%s: %s", endpoint, e.Error())}
			}
			// Part of the upload went to a node that stopped leading: the
			// client starts over (through this node, not the endpoint named).
			ue := errcode.Unavailable.With("the leader changed while the snapshot was being forwarded; retry")
			ue.RetryAfter = 1
			return ue
		}
	}
	h.Logger.Info("forwarded a snapshot restore to the leader", "leader", endpoint, "status", resp.StatusCode,
		"bytes", body.bytes(), "took", time.Since(start))
	for _, k := range []string{"Content-Type", wire.HeaderRetryAfter} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(raw)
	return nil
}

// uploadBody is a request body that may be handed to the leader: it counts
// what was read from it, and closing it leaves the request's body open for
// another attempt.
type uploadBody struct {
	r io.Reader
	n atomic.Int64
	// read is set by the first Read, even one that returns nothing.
	read atomic.Bool
}

func (b *uploadBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	n, err := b.r.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func (b *uploadBody) used() bool { return b.read.Load() }

// checked returns r, which at its end fails with expected_sha256_mismatch
// instead of io.EOF when what it gave does not have the SHA-256 want (hex;
// "": r as it is).
func checked(r io.Reader, want string) io.Reader {
	if want == "" {
		return r
	}
	return &checkedReader{r: r, h: sha256.New(), want: strings.ToLower(want)}
}

type checkedReader struct {
	r    io.Reader
	h    hash.Hash
	want string
}

func (c *checkedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	if err == io.EOF {
		if got := hex.EncodeToString(c.h.Sum(nil)); got != c.want {
			return n, errcode.ChecksumMismatch.With("the snapshot's SHA-256 is %s, not the %s %s: it was damaged", got,
				wire.HeaderExpectedSHA256, c.want)
		}
	}
	return n, err
}
func (b *uploadBody) bytes() int64 { return b.n.Load() }

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
		ExpiresAt: ceilUnix(h.Clock.Now().Add(h.TC.MembershipTTL()))})
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
