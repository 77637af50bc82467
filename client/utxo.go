package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/raftlockd/raftlockd/wire"
)

// UTXO records: create a transaction's outputs, spend them, change their
// flags and read a transaction back. A rejected item fails the whole call:
// the *Error's Envelope lists the failed items (Spends for a spend,
// Outpoints for unspend, freeze, unfreeze and reassign).
//
// Spend (the same spending data again is a success), the calls that set a
// value (flags, preserve, mined, longest chain, height), block apply and Get
// are resent after an ambiguous failure. Create, freeze, unfreeze and
// reassign are not: resent after their first attempt was applied, they
// would be refused because of that attempt (tx_exists, ALREADY_FROZEN,
// UTXO_NOT_FROZEN). Unspend and block rollback are not either: resent after
// their first attempt was applied, they would also take back a spend, or
// undo a block, made since by someone else.

func (c *Client) utxoPost(ctx context.Context, path string, idempotent bool, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("client: encode %s request: %w", path, err)
	}
	_, err = c.doJSON(ctx, call{method: http.MethodPost, path: path, body: body, idempotent: idempotent}, out)
	return err
}

// UTXOCreate records a transaction and its outputs (with TxnID: staged in
// that two-phase transaction).
func (c *Client) UTXOCreate(ctx context.Context, req wire.UTXOCreateRequest) (*wire.UTXOCreateResponse, error) {
	var out wire.UTXOCreateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/create", false, req, &out)
}

// UTXOSpend spends outputs: all of them, or none (then the error's
// Envelope.Spends says which failed and why).
func (c *Client) UTXOSpend(ctx context.Context, req wire.UTXOSpendRequest) (*wire.UTXOSpendResponse, error) {
	var out wire.UTXOSpendResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/spend", true, req, &out)
}

// UTXOUnspend takes the spends of outputs back.
func (c *Client) UTXOUnspend(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	var out wire.UTXOUpdateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/unspend", false, req, &out)
}

// UTXOFreeze freezes outputs: they cannot be spent until unfrozen.
func (c *Client) UTXOFreeze(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	var out wire.UTXOUpdateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/freeze", false, req, &out)
}

// UTXOUnfreeze makes frozen outputs spendable again.
func (c *Client) UTXOUnfreeze(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	var out wire.UTXOUpdateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/unfreeze", false, req, &out)
}

// UTXOReassign gives a frozen output a new hash.
func (c *Client) UTXOReassign(ctx context.Context, req wire.UTXOReassignRequest) (*wire.UTXOUpdateResponse, error) {
	var out wire.UTXOUpdateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/reassign", false, req, &out)
}

// UTXOSetConflicting sets or clears the conflicting flag of transactions.
func (c *Client) UTXOSetConflicting(ctx context.Context, req wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error) {
	var out wire.UTXOUpdateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/conflicting", true, req, &out)
}

// UTXOSetLocked sets or clears the locked flag of transactions.
func (c *Client) UTXOSetLocked(ctx context.Context, req wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error) {
	var out wire.UTXOUpdateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/locked", true, req, &out)
}

// UTXOPreserve keeps transactions until a block height.
func (c *Client) UTXOPreserve(ctx context.Context, req wire.UTXOPreserveRequest) (*wire.UTXOUpdateResponse, error) {
	var out wire.UTXOUpdateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/preserve", true, req, &out)
}

// UTXOSetMined places transactions in a block (with Unset: takes them out).
func (c *Client) UTXOSetMined(ctx context.Context, req wire.UTXOMinedRequest) (*wire.UTXOUpdateResponse, error) {
	var out wire.UTXOUpdateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/mined", true, req, &out)
}

// UTXOSetLongestChain says whether transactions' blocks are on the longest
// chain.
func (c *Client) UTXOSetLongestChain(ctx context.Context, req wire.UTXOLongestChainRequest) (*wire.UTXOUpdateResponse, error) {
	var out wire.UTXOUpdateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/longest-chain", true, req, &out)
}

// UTXOSetHeight sets the chain height the records are judged at.
func (c *Client) UTXOSetHeight(ctx context.Context, req wire.UTXOHeightRequest) (*wire.UTXOUpdateResponse, error) {
	var out wire.UTXOUpdateResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/height", true, req, &out)
}

// UTXOGet reads every record of a transaction; stale reads the serving
// node's own state without asking the leader (it may be behind).
func (c *Client) UTXOGet(ctx context.Context, txid string, stale bool) (*wire.UTXOTx, error) {
	q := url.Values{"txid": {txid}}
	if stale {
		q.Set("stale", "1")
	}
	var out wire.UTXOTx
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/utxo/tx", query: q, idempotent: true}, &out)
	return &out, err
}

// UTXOApplyBlock applies a whole block. Applying the block already applied
// is a no-op (AlreadyApplied), so the call is resent after an ambiguous
// failure.
func (c *Client) UTXOApplyBlock(ctx context.Context, req wire.UTXOBlockRequest) (*wire.UTXOBlockResponse, error) {
	var out wire.UTXOBlockResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/blocks/apply", true, req, &out)
}

// UTXORollback undoes the blocks above toHeight; rolling back to a height
// already reached changes nothing. It is not resent after an ambiguous
// failure: a block applied since the first attempt would be undone too.
func (c *Client) UTXORollback(ctx context.Context, toHeight uint32) (*wire.UTXORollbackResponse, error) {
	var out wire.UTXORollbackResponse
	return &out, c.utxoPost(ctx, "/v1/utxo/blocks/rollback", false, wire.UTXORollbackRequest{ToHeight: toHeight}, &out)
}

// UTXOPrune runs one prune pass now and reports what it did.
func (c *Client) UTXOPrune(ctx context.Context) (*wire.UTXOPruneResponse, error) {
	var out wire.UTXOPruneResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/utxo/prune", idempotent: true}, &out)
	return &out, err
}

// UTXOStatus returns the UTXO status view.
func (c *Client) UTXOStatus(ctx context.Context, stale bool) (*wire.UTXOStatus, error) {
	q := url.Values{}
	if stale {
		q.Set("stale", "1")
	}
	var out wire.UTXOStatus
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/utxo/status", query: q, idempotent: true}, &out)
	return &out, err
}
