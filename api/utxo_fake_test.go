package api

import (
	"context"
	"strings"
	"sync"

	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/wire"
)

// recordingUTXOs is the fake UTXO service of the tests: it records every
// call that reaches it, in order, and answers it with Fail, or with a
// plausible success when Fail is nil. Set Fail between calls.
type recordingUTXOs struct {
	mu    sync.Mutex
	calls []string
	reqs  []any
	Fail  error
}

var _ UTXOs = (*recordingUTXOs)(nil)

// utxoRead is what the fake records for a Get.
type utxoRead struct {
	TxID string
	C    rm.Consistency
}

// Called is the names of the calls so far ("create", "freeze", "get", …:
// the last part of the endpoint's path).
func (f *recordingUTXOs) Called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// Reqs is the requests of the calls so far: a wire request for each POST,
// a utxoRead for each Get.
func (f *recordingUTXOs) Reqs() []any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]any(nil), f.reqs...)
}

// answer records the call and answers it with f.Fail or with ok.
func answer[Resp any](f *recordingUTXOs, name string, req any, ok *Resp) (*Resp, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name)
	f.reqs = append(f.reqs, req)
	if f.Fail != nil {
		return nil, f.Fail
	}
	return ok, nil
}

func (f *recordingUTXOs) update(name string, req any) (*wire.UTXOUpdateResponse, error) {
	return answer(f, name, req, &wire.UTXOUpdateResponse{Updated: 1})
}

func (f *recordingUTXOs) Create(_ context.Context, req wire.UTXOCreateRequest) (*wire.UTXOCreateResponse, error) {
	return answer(f, "create", req, &wire.UTXOCreateResponse{TxID: req.TxID, Records: len(req.Outputs)})
}

func (f *recordingUTXOs) Spend(_ context.Context, req wire.UTXOSpendRequest) (*wire.UTXOSpendResponse, error) {
	return answer(f, "spend", req, &wire.UTXOSpendResponse{Spent: len(req.Spends)})
}

func (f *recordingUTXOs) Unspend(_ context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	return f.update("unspend", req)
}

func (f *recordingUTXOs) Freeze(_ context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	return f.update("freeze", req)
}

func (f *recordingUTXOs) Unfreeze(_ context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	return f.update("unfreeze", req)
}

func (f *recordingUTXOs) Reassign(_ context.Context, req wire.UTXOReassignRequest) (*wire.UTXOUpdateResponse, error) {
	return f.update("reassign", req)
}

func (f *recordingUTXOs) SetConflicting(_ context.Context, req wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error) {
	return f.update("conflicting", req)
}

func (f *recordingUTXOs) SetLocked(_ context.Context, req wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error) {
	return f.update("locked", req)
}

func (f *recordingUTXOs) Preserve(_ context.Context, req wire.UTXOPreserveRequest) (*wire.UTXOUpdateResponse, error) {
	return f.update("preserve", req)
}

func (f *recordingUTXOs) SetMined(_ context.Context, req wire.UTXOMinedRequest) (*wire.UTXOUpdateResponse, error) {
	return f.update("mined", req)
}

func (f *recordingUTXOs) SetLongestChain(_ context.Context, req wire.UTXOLongestChainRequest) (*wire.UTXOUpdateResponse, error) {
	return f.update("longest-chain", req)
}

func (f *recordingUTXOs) SetHeight(_ context.Context, req wire.UTXOHeightRequest) (*wire.UTXOUpdateResponse, error) {
	return f.update("height", req)
}

// Get answers with one unspent output of 5 satoshis.
func (f *recordingUTXOs) Get(_ context.Context, txid string, c rm.Consistency) (*wire.UTXOTx, error) {
	return answer(f, "get", utxoRead{txid, c}, &wire.UTXOTx{TxID: txid,
		Outputs: []wire.UTXOTxOutput{{Vout: 0, UTXOHash: strings.Repeat("b", 64), Satoshis: 5}}})
}
