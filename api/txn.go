package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/raftlockd/raftlockd/cluster"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/tc"
	"github.com/raftlockd/raftlockd/wire"
)

// The transaction endpoints: the coordinator's (/v1/txn/decide, replay,
// status, and the RM registry under /v1/tc/rm/...) and the resource
// manager's (/v1/txn/prepare, commit, rollback).

// Coordinator is the island's transaction coordinator.
type Coordinator interface {
	Decide(ctx context.Context, d tc.Decision) (*fsm.TxnInfo, error)
	Replay(ctx context.Context, txn string) (*fsm.TxnInfo, error)
	Status(ctx context.Context, txn string) (*fsm.TxnInfo, error)
	Register(ctx context.Context, change fsm.RMRegisterCmd) (fsm.RMInfo, error)
	Registry(ctx context.Context) (map[string]fsm.RMEntry, int64, error)
}

// ResourceManager applies other islands' coordinators' requests here.
type ResourceManager interface {
	Prepare(ctx context.Context, c rm.Coordinated) (*fsm.TxnInfo, error)
	Apply(ctx context.Context, c rm.Coordinated) (*fsm.TxnInfo, error)
}

// Leader is what a follower needs to hand a coordinator request to the
// leader.
type Leader interface {
	IsLeader() bool
	Leader() (id, endpoint string)
	// AwaitLeader is Leader after waiting (a bounded time: no_leader then)
	// for a leader to be known.
	AwaitLeader(ctx context.Context) (id, endpoint string, err error)
	BackendHash() string
	// WhileLeads bounds a request handed to leader id: its context ends
	// soon after id stops leading.
	WhileLeads(ctx context.Context, id string) (context.Context, context.CancelFunc)
}

func (h *handler) routeTxn(route func(method, path string, fn func(http.ResponseWriter, *http.Request) error)) {
	if h.Coordinator != nil {
		route(http.MethodPost, "/v1/txn/decide", h.leaderOnly(h.txnDecide))
		route(http.MethodPost, "/v1/txn/replay", h.leaderOnly(h.txnReplay))
		route(http.MethodGet, "/v1/txn/status", h.txnStatus)
		route(http.MethodPost, "/v1/tc/rm/register", h.leaderOnly(h.rmRegister(false)))
		route(http.MethodPost, "/v1/tc/rm/unregister", h.leaderOnly(h.rmRegister(true)))
		route(http.MethodGet, "/v1/tc/rm/list", h.rmList)
	}
	if h.RM != nil {
		route(http.MethodPost, "/v1/txn/prepare", h.txnRM(fsm.TxnPending))
		route(http.MethodPost, "/v1/txn/commit", h.txnRM(fsm.TxnCommit))
		route(http.MethodPost, "/v1/txn/rollback", h.txnRM(fsm.TxnRollback))
	}
}

// leaderOnly serves fn on the leader and passes the request on to the
// leader's API from a follower (once: a forwarded request that reaches a
// node that is not the leader either answers not_leader).
func (h *handler) leaderOnly(fn func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if h.LeaderOf == nil || h.LeaderOf.IsLeader() {
			return fn(w, r)
		}
		forwarded := r.Header.Get(wire.HeaderForwardedBy) != ""
		id, endpoint := h.LeaderOf.Leader()
		if !forwarded {
			// As every other request does, one that finds no leader waits
			// for the election to end.
			var err error
			if id, endpoint, err = h.LeaderOf.AwaitLeader(r.Context()); err != nil {
				return err
			}
			if h.LeaderOf.IsLeader() {
				return fn(w, r)
			}
		}
		if endpoint == "" || forwarded {
			e := errcode.NotLeader.With("node %s is not the leader", h.NodeID)
			if id == "" {
				e = errcode.NoLeader.With("no leader is known")
			}
			e.LeaderEndpoint, e.RetryAfter = endpoint, 1
			return e
		}
		body, err := readBody(w, r, h.MaxBodyBytes)
		if err != nil {
			return err
		}
		// A leader that vanished without closing its connections (a paused
		// process, a cut network) is not waited for past its successor's
		// election.
		fctx, done := h.LeaderOf.WhileLeads(r.Context(), id)
		defer done()
		req, err := http.NewRequestWithContext(fctx, r.Method, endpoint+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			return errcode.Internal.With("forwarding: %v", err)
		}
		req.Header = r.Header.Clone()
		req.Header.Set(wire.HeaderForwardedBy, h.NodeID)
		if cid := correlation(r.Context()); cid != "" {
			req.Header.Set(wire.HeaderCorrelationID, cid)
		}
		// The client's X-Raftlockd-Timeout, less what has passed here.
		if d, ok := r.Context().Deadline(); ok {
			if left := time.Until(d).Truncate(time.Millisecond); left > 0 {
				req.Header.Set(wire.HeaderTimeout, left.String())
			}
		}
		resp, err := h.peerHTTP().Do(req)
		if err != nil {
			if r.Context().Err() != nil {
				return fmt.Errorf("api: forwarding to the leader %s: %w", id, r.Context().Err())
			}
			e := errcode.Unavailable.With("forwarding to the leader %s: %v", id, context.Cause(fctx))
			if fctx.Err() == nil {
				e = errcode.Unavailable.With("forwarding to the leader %s: %v", id, err)
			}
			e.RetryAfter = 1
			return e
		}
		defer resp.Body.Close()
		for _, k := range []string{"Content-Type", wire.HeaderRetryAfter, wire.HeaderLeader} {
			if v := resp.Header.Get(k); v != "" {
				w.Header().Set(k, v)
			}
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
		return nil
	}
}

func (h *handler) peerHTTP() *http.Client {
	if h.PeerHTTP != nil {
		return h.PeerHTTP
	}
	return http.DefaultClient
}

func participantsIn(ps []wire.TxnParticipant) []fsm.Participant {
	out := make([]fsm.Participant, len(ps))
	for i, p := range ps {
		out[i] = fsm.Participant{Namespace: p.Namespace, Key: p.Key, Backend: p.BackendHash}
	}
	return out
}

func participantsOut(ps []fsm.Participant, self string) []wire.TxnParticipant {
	out := make([]wire.TxnParticipant, len(ps))
	for i, p := range ps {
		b := p.Backend
		if b == "" {
			b = self
		}
		out[i] = wire.TxnParticipant{Namespace: p.Namespace, Key: p.Key, BackendHash: b}
	}
	return out
}

// islandClockSkew is how far another island's clock may run ahead of this
// one's before the expiry of its prepare is refused as beyond --max-ttl.
const islandClockSkew = time.Minute

// expiresAt reads a transaction's expires_at_unix: 0 (the default) or a
// time after now and at most maxTTL from it (in whole seconds, rounded up).
// The bound keeps a pending transaction from holding its keys longer than a
// lease may, and its expiry in Unix milliseconds from overflowing.
func expiresAt(unix int64, now time.Time, maxTTL time.Duration) (time.Time, error) {
	if unix == 0 {
		return time.Time{}, nil
	}
	if unix <= now.Unix() || unix > ceilUnix(now.Add(maxTTL)) {
		return time.Time{}, errcode.InvalidTTL.With("expires_at_unix must be 0 or a time in the future at most %s from now", maxTTL)
	}
	return time.Unix(unix, 0), nil
}

// decisionExpiry is expiresAt for a request deciding state: only a pending
// decision's expiry must be valid. A commit or rollback (resent, say, with
// its prepare's old expiry) is answered as a decision whatever expiry it
// carries; the expiry only bounds what a prepare holds.
func decisionExpiry(state string, unix int64, now time.Time, maxTTL time.Duration) (time.Time, error) {
	exp, err := expiresAt(unix, now, maxTTL)
	if err != nil && state != fsm.TxnPending {
		return time.Time{}, nil
	}
	return exp, err
}

func (h *handler) txnDecide(w http.ResponseWriter, r *http.Request) error {
	var req wire.TxnDecisionRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := h.meantHere(r.Header.Get(wire.HeaderTargetBackend)); err != nil {
		return err
	}
	exp, err := decisionExpiry(req.State, req.ExpiresAtUnix, h.Clock.Now(), h.MaxTTL)
	if err != nil {
		return err
	}
	info, err := h.Coordinator.Decide(r.Context(), tc.Decision{TxnID: req.TxnID, State: req.State,
		Participants: participantsIn(req.Participants), ExpiresAt: exp, Owner: req.Owner})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.TxnDecisionResponse{TxnID: info.TxnID, State: info.State, TCTerm: info.TCTerm})
	return nil
}

// meantHere refuses a decide or replay meant for another island's
// coordinator (target): this island has no record of the transaction, and
// would decide it, or presume it aborted, on its own.
func (h *handler) meantHere(target string) error {
	if target == "" || h.LeaderOf == nil {
		return nil
	}
	if self := h.LeaderOf.BackendHash(); target != self {
		return rm.NotTarget(self, target)
	}
	return nil
}

func (h *handler) txnReplay(w http.ResponseWriter, r *http.Request) error {
	var req wire.TxnReplayRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := h.meantHere(r.Header.Get(wire.HeaderTargetBackend)); err != nil {
		return err
	}
	info, err := h.Coordinator.Replay(r.Context(), req.TxnID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.TxnReplayResponse{TxnID: info.TxnID, State: info.State, TCTerm: info.TCTerm})
	return nil
}

func (h *handler) txnStatus(w http.ResponseWriter, r *http.Request) error {
	info, err := h.Coordinator.Status(r.Context(), r.URL.Query().Get("txn_id"))
	if err != nil {
		return err
	}
	self := ""
	if h.LeaderOf != nil {
		self = h.LeaderOf.BackendHash()
	}
	writeJSON(w, http.StatusOK, wire.TxnStatusResponse{TxnID: info.TxnID, State: info.State, Reason: info.Reason,
		Detail: info.Detail, BackendHash: self, TCBackendHash: info.Home, TCTerm: info.TCTerm,
		ExpiresAtUnix: unixSeconds(info.ExpiresAt), Participants: participantsOut(info.Participants, self),
		Prepared: info.Prepared, Acked: info.Acked, Refused: info.Refused})
	return nil
}

// txnRM serves the resource manager endpoints: prepare (state pending),
// commit and rollback.
func (h *handler) txnRM(state string) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		var req wire.TxnDecisionRequest
		if err := h.decodeJSON(w, r, &req); err != nil {
			return err
		}
		if req.State != "" && req.State != state {
			return errcode.InvalidParams.With("state %q does not match %s", req.State, r.URL.Path)
		}
		// Another island's coordinator computed the expiry by its own
		// clock: the bound allows for some skew between the islands.
		exp, err := decisionExpiry(state, req.ExpiresAtUnix, h.Clock.Now(), h.MaxTTL+islandClockSkew)
		if err != nil {
			return err
		}
		c := rm.Coordinated{TxnID: req.TxnID, State: state, Home: req.TCBackendHash, Term: req.TCTerm,
			Target: req.TargetBackendHash, ExpiresAt: exp, Owner: req.Owner, Participants: participantsIn(req.Participants)}
		var info *fsm.TxnInfo
		if state == fsm.TxnPending {
			info, err = h.RM.Prepare(r.Context(), c)
		} else {
			info, err = h.RM.Apply(r.Context(), c)
		}
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, wire.TxnDecisionResponse{TxnID: info.TxnID, State: info.State, TCTerm: info.TCTerm})
		return nil
	}
}

// maxChangeAhead is how far ahead of this server's clock a registry change
// passed on by another island may be dated: the islands' clocks may differ
// by that much.
const maxChangeAhead = 24 * time.Hour

func (h *handler) rmRegister(remove bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		var req wire.TCRMRegisterRequest
		if err := h.decodeJSON(w, r, &req); err != nil {
			return err
		}
		backend, err := rm.BackendHash(req.BackendHash)
		if err != nil {
			return err
		}
		if backend == "" {
			return errcode.InvalidParams.With("backend_hash is required")
		}
		ep, err := cluster.NormalizeEndpoint(req.Endpoint)
		if err != nil {
			return err
		}
		if h.Auth != nil && !remove && strings.HasPrefix(ep, "http://") {
			return errcode.InvalidEndpoint.With("%q: with mTLS, islands are called over https", req.Endpoint)
		}
		change := fsm.RMRegisterCmd{Backend: backend, Endpoint: ep, Remove: remove, PassedOn: req.PassedOn}
		if req.PassedOn {
			// The time orders this change against others of the endpoint
			// on every island: one far ahead would win over every later
			// change, so a registration could never be undone.
			if at := req.ChangedAtUnixMs; at < 0 || at > h.Clock.Now().Add(maxChangeAhead).UnixMilli() {
				return errcode.InvalidParams.With("changed_at_unix_ms %d is not a time up to %s from now", at, maxChangeAhead)
			}
			change.ChangedAt = req.ChangedAtUnixMs
		}
		info, err := h.Coordinator.Register(r.Context(), change)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, wire.TCRMRegisterResponse{BackendHash: backend, Endpoints: nonNil(info.Entry.Endpoints),
			UpdatedAtUnix: unixSeconds(info.Entry.UpdatedAt)})
		return nil
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (h *handler) rmList(w http.ResponseWriter, r *http.Request) error {
	rms, latest, err := h.Coordinator.Registry(r.Context())
	if err != nil {
		return err
	}
	out := wire.TCRMListResponse{Backends: []wire.TCRMBackend{}}
	for b, e := range rms {
		out.Backends = append(out.Backends, wire.TCRMBackend{BackendHash: b, Endpoints: nonNil(e.Endpoints),
			UpdatedAtUnix: unixSeconds(e.UpdatedAt)})
		latest = max(latest, e.UpdatedAt)
	}
	sort.Slice(out.Backends, func(i, j int) bool { return out.Backends[i].BackendHash < out.Backends[j].BackendHash })
	out.UpdatedAtUnix = unixSeconds(latest)
	writeJSON(w, http.StatusOK, out)
	return nil
}
