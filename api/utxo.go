package api

import (
	"bytes"
	"context"
	"net/http"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/wire"
)

// The UTXO endpoints (/v1/utxo/...): create, spend and change the records
// of unspent transaction outputs, and read a transaction's records.

// UTXOs is the UTXO service the /v1/utxo/... handlers call.
type UTXOs interface {
	Create(ctx context.Context, req wire.UTXOCreateRequest) (*wire.UTXOCreateResponse, error)
	Spend(ctx context.Context, req wire.UTXOSpendRequest) (*wire.UTXOSpendResponse, error)
	Unspend(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error)
	Freeze(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error)
	Unfreeze(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error)
	Reassign(ctx context.Context, req wire.UTXOReassignRequest) (*wire.UTXOUpdateResponse, error)
	SetConflicting(ctx context.Context, req wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error)
	SetLocked(ctx context.Context, req wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error)
	Preserve(ctx context.Context, req wire.UTXOPreserveRequest) (*wire.UTXOUpdateResponse, error)
	SetMined(ctx context.Context, req wire.UTXOMinedRequest) (*wire.UTXOUpdateResponse, error)
	SetLongestChain(ctx context.Context, req wire.UTXOLongestChainRequest) (*wire.UTXOUpdateResponse, error)
	SetHeight(ctx context.Context, req wire.UTXOHeightRequest) (*wire.UTXOUpdateResponse, error)
	Get(ctx context.Context, txid string, c rm.Consistency) (*wire.UTXOTx, error)
}

var _ UTXOs = (*rm.UTXOs)(nil)

// defaultMaxUTXOBodyBytes bounds the bodies of create and spend, which
// carry whole transactions' outputs or a batch of spends.
const defaultMaxUTXOBodyBytes = 32 << 20

func (h *handler) routeUTXO(route func(method, path string, fn func(http.ResponseWriter, *http.Request) error)) {
	if h.UTXOs == nil {
		return
	}
	u, big, small := h.UTXOs, h.MaxUTXOBodyBytes, h.MaxBodyBytes
	route(http.MethodPost, "/v1/utxo/create", utxoPost(h, big, u.Create))
	route(http.MethodPost, "/v1/utxo/spend", utxoPost(h, big, u.Spend))
	route(http.MethodPost, "/v1/utxo/unspend", utxoPost(h, small, u.Unspend))
	route(http.MethodPost, "/v1/utxo/freeze", utxoPost(h, small, u.Freeze))
	route(http.MethodPost, "/v1/utxo/unfreeze", utxoPost(h, small, u.Unfreeze))
	route(http.MethodPost, "/v1/utxo/reassign", utxoPost(h, small, u.Reassign))
	route(http.MethodPost, "/v1/utxo/conflicting", utxoPost(h, small, u.SetConflicting))
	route(http.MethodPost, "/v1/utxo/locked", utxoPost(h, small, u.SetLocked))
	route(http.MethodPost, "/v1/utxo/preserve", utxoPost(h, small, u.Preserve))
	route(http.MethodPost, "/v1/utxo/mined", utxoPost(h, small, u.SetMined))
	route(http.MethodPost, "/v1/utxo/longest-chain", utxoPost(h, small, u.SetLongestChain))
	route(http.MethodPost, "/v1/utxo/height", utxoPost(h, small, u.SetHeight))
	route(http.MethodGet, "/v1/utxo/tx", h.utxoGet)
}

// utxoPost serves a UTXO endpoint whose JSON body (at most limit bytes) is
// the request of call and whose answer is call's result.
func utxoPost[Req, Resp any](h *handler, limit int64, call func(context.Context, Req) (*Resp, error)) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		var req Req
		if err := decodeUTXO(w, r, limit, &req); err != nil {
			return err
		}
		out, err := call(r.Context(), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
}

// decodeUTXO reads the body of a UTXO request: one JSON object of at most
// limit bytes, without unknown fields or trailing data. Every UTXO request
// has fields to fill, so an empty body is missing_body. A required field
// that is null is as absent as one left out.
func decodeUTXO(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	raw, err := readBody(w, r, limit)
	if err != nil {
		return err
	}
	trimmed := bytes.TrimSpace(raw)
	switch {
	case len(trimmed) == 0:
		return errcode.MissingBody.With("%s needs a JSON object", r.URL.Path)
	case trimmed[0] != '{':
		return errcode.InvalidBody.With("the body of %s must be a JSON object", r.URL.Path)
	}
	if err := decodeStrict(raw, v, "JSON"); err != nil {
		return err
	}
	if f := wire.MissingRequired(raw, v); f != "" {
		return errcode.InvalidBody.With("%s needs %s", r.URL.Path, f)
	}
	return nil
}

func (h *handler) utxoGet(w http.ResponseWriter, r *http.Request) error {
	c, err := consistency(r)
	if err != nil {
		return err
	}
	tx, err := h.UTXOs.Get(r.Context(), r.URL.Query().Get("txid"), c)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, tx)
	return nil
}

// guardedUTXOs checks every call against the caller's permissions on the
// UTXO namespace: reading for Get, writing for everything else.
type guardedUTXOs struct{ UTXOs }

func (g guardedUTXOs) Create(ctx context.Context, req wire.UTXOCreateRequest) (*wire.UTXOCreateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.Create(ctx, req)
}

func (g guardedUTXOs) Spend(ctx context.Context, req wire.UTXOSpendRequest) (*wire.UTXOSpendResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.Spend(ctx, req)
}

func (g guardedUTXOs) Unspend(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.Unspend(ctx, req)
}

func (g guardedUTXOs) Freeze(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.Freeze(ctx, req)
}

func (g guardedUTXOs) Unfreeze(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.Unfreeze(ctx, req)
}

func (g guardedUTXOs) Reassign(ctx context.Context, req wire.UTXOReassignRequest) (*wire.UTXOUpdateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.Reassign(ctx, req)
}

func (g guardedUTXOs) SetConflicting(ctx context.Context, req wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.SetConflicting(ctx, req)
}

func (g guardedUTXOs) SetLocked(ctx context.Context, req wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.SetLocked(ctx, req)
}

func (g guardedUTXOs) Preserve(ctx context.Context, req wire.UTXOPreserveRequest) (*wire.UTXOUpdateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.Preserve(ctx, req)
}

func (g guardedUTXOs) SetMined(ctx context.Context, req wire.UTXOMinedRequest) (*wire.UTXOUpdateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.SetMined(ctx, req)
}

func (g guardedUTXOs) SetLongestChain(ctx context.Context, req wire.UTXOLongestChainRequest) (*wire.UTXOUpdateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.SetLongestChain(ctx, req)
}

func (g guardedUTXOs) SetHeight(ctx context.Context, req wire.UTXOHeightRequest) (*wire.UTXOUpdateResponse, error) {
	if err := permit(ctx, wire.UTXONamespace, true); err != nil {
		return nil, err
	}
	return g.UTXOs.SetHeight(ctx, req)
}

func (g guardedUTXOs) Get(ctx context.Context, txid string, c rm.Consistency) (*wire.UTXOTx, error) {
	if err := permit(ctx, wire.UTXONamespace, false); err != nil {
		return nil, err
	}
	return g.UTXOs.Get(ctx, txid, c)
}
