package api

import (
	"context"
	_ "embed"
	"net/http"

	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/wire"
)

// The chain endpoints: apply and roll back blocks over the UTXO records,
// run a prune pass, the UTXO status view and its HTML page (/ui/status).

// Chain is the service the block, prune and status handlers call.
type Chain interface {
	ApplyBlock(ctx context.Context, req wire.UTXOBlockRequest) (*wire.UTXOBlockResponse, error)
	Rollback(ctx context.Context, req wire.UTXORollbackRequest) (*wire.UTXORollbackResponse, error)
	Prune(ctx context.Context) (*wire.UTXOPruneResponse, error)
	Status(ctx context.Context, c rm.Consistency) (*wire.UTXOStatus, error)
}

var _ Chain = (*rm.Chain)(nil)

//go:embed ui/status.html
var statusPage []byte

func (h *handler) routeChain(route func(method, path string, fn func(http.ResponseWriter, *http.Request) error)) {
	if h.Chain == nil {
		return
	}
	c := h.Chain
	route(http.MethodPost, "/v1/utxo/blocks/apply", utxoPost(h, h.MaxUTXOBodyBytes, writing(c.ApplyBlock)))
	route(http.MethodPost, "/v1/utxo/blocks/rollback", utxoPost(h, h.MaxBodyBytes, writing(c.Rollback)))
	route(http.MethodPost, "/v1/utxo/prune", h.utxoPrune)
	route(http.MethodGet, "/v1/utxo/status", h.utxoStatus)
	route(http.MethodGet, "/ui/status", func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		_, _ = w.Write(statusPage)
		return nil
	})
}

// writing checks that the caller may write the UTXO namespace before call.
func writing[Req, Resp any](call func(context.Context, Req) (*Resp, error)) func(context.Context, Req) (*Resp, error) {
	return func(ctx context.Context, req Req) (*Resp, error) {
		if err := permit(ctx, wire.UTXONamespace, true); err != nil {
			return nil, err
		}
		return call(ctx, req)
	}
}

func (h *handler) utxoPrune(w http.ResponseWriter, r *http.Request) error {
	// The pass takes no parameters: an empty body or {}.
	if err := h.decodeJSON(w, r, &struct{}{}); err != nil {
		return err
	}
	if err := permit(r.Context(), wire.UTXONamespace, true); err != nil {
		return err
	}
	out, err := h.Chain.Prune(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *handler) utxoStatus(w http.ResponseWriter, r *http.Request) error {
	c, err := consistency(r)
	if err != nil {
		return err
	}
	if err := permit(r.Context(), wire.UTXONamespace, false); err != nil {
		return err
	}
	out, err := h.Chain.Status(r.Context(), c)
	if err != nil {
		return err
	}
	out.Node = h.NodeID
	writeJSON(w, http.StatusOK, out)
	return nil
}
