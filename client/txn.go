package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/raftlockd/raftlockd/wire"
)

// Transactions across islands: the coordinator endpoints (decide, replay,
// status), the resource manager endpoints a coordinator calls on other
// islands (prepare, commit, rollback) and the RM registry. Every call is
// idempotent: a decision, once recorded, never changes.

func (c *Client) postJSON(ctx context.Context, path string, in, out any) error {
	body, _ := json.Marshal(in)
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: path, body: body, idempotent: true}, out)
	return err
}

// TxnDecide records a decision (pending, commit or rollback) with the
// island's coordinator, which applies and fans it out.
func (c *Client) TxnDecide(ctx context.Context, req wire.TxnDecisionRequest) (*wire.TxnDecisionResponse, error) {
	return c.TxnDecideAt(ctx, req, "")
}

// TxnDecideAt is TxnDecide of a transaction coordinated by island backend
// (empty: whichever island the server is): a server of another island
// answers txn_backend_mismatch, naming its island, instead of deciding.
func (c *Client) TxnDecideAt(ctx context.Context, req wire.TxnDecisionRequest, backend string) (*wire.TxnDecisionResponse, error) {
	var out wire.TxnDecisionResponse
	_, err := c.doJSON(ctx, toIsland(call{method: http.MethodPost, path: "/v1/txn/decide", body: mustJSON(req), idempotent: true}, backend), &out)
	return &out, err
}

// toIsland marks cl as meant for island backend (X-Raftlockd-Target-Backend).
func toIsland(cl call, backend string) call {
	if backend != "" {
		cl.header = http.Header{wire.HeaderTargetBackend: {backend}}
	}
	return cl
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TxnPrepare asks an island's resource manager to lock and enlist its
// participants for the coordinator named in req.
func (c *Client) TxnPrepare(ctx context.Context, req wire.TxnDecisionRequest) (*wire.TxnDecisionResponse, error) {
	var out wire.TxnDecisionResponse
	return &out, c.postJSON(ctx, "/v1/txn/prepare", req, &out)
}

// TxnApply asks an island's resource manager to apply a decision (req.State
// commit or rollback) to its participants.
func (c *Client) TxnApply(ctx context.Context, req wire.TxnDecisionRequest) (*wire.TxnDecisionResponse, error) {
	path := "/v1/txn/commit"
	if req.State == wire.TxnStateRollback {
		path = "/v1/txn/rollback"
	}
	var out wire.TxnDecisionResponse
	return &out, c.postJSON(ctx, path, req, &out)
}

// TxnReplay applies the recorded decision of txnID again where it is
// missing.
func (c *Client) TxnReplay(ctx context.Context, txnID string) (*wire.TxnReplayResponse, error) {
	return c.TxnReplayAt(ctx, txnID, "")
}

// TxnReplayAt is TxnReplay of a transaction coordinated by island backend
// (empty: whichever island the server is): a server of another island
// answers txn_backend_mismatch, naming its island, instead of replaying.
func (c *Client) TxnReplayAt(ctx context.Context, txnID, backend string) (*wire.TxnReplayResponse, error) {
	var out wire.TxnReplayResponse
	_, err := c.doJSON(ctx, toIsland(call{method: http.MethodPost, path: "/v1/txn/replay",
		body: mustJSON(wire.TxnReplayRequest{TxnID: txnID}), idempotent: true}, backend), &out)
	return &out, err
}

// TxnStatus returns the island's record of a transaction.
func (c *Client) TxnStatus(ctx context.Context, txnID string) (*wire.TxnStatusResponse, error) {
	var out wire.TxnStatusResponse
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/txn/status", query: url.Values{"txn_id": {txnID}},
		idempotent: true}, &out)
	return &out, err
}

// RMRegister adds an RM endpoint for an island to the registry (remove:
// takes it out).
func (c *Client) RMRegister(ctx context.Context, req wire.TCRMRegisterRequest, remove bool) (*wire.TCRMRegisterResponse, error) {
	path := "/v1/tc/rm/register"
	if remove {
		path = "/v1/tc/rm/unregister"
	}
	var out wire.TCRMRegisterResponse
	return &out, c.postJSON(ctx, path, req, &out)
}

// RMList returns the RM registry.
func (c *Client) RMList(ctx context.Context) (*wire.TCRMListResponse, error) {
	var out wire.TCRMListResponse
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/tc/rm/list", idempotent: true}, &out)
	return &out, err
}
