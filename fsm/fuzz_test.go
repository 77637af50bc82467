package fsm

import (
	"os"
	"strings"
	"testing"
)

// fuzzDir is a fresh directory for one fuzz input's state machine: in
// memory (/dev/shm) where there is one, since opening and closing a state
// file syncs it to disk.
func fuzzDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "raftlockd-fuzz-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// fuzzPrelude builds the state FuzzDecode applies its entries to: a lease
// with a staged write and a waiter behind it (default/a), a committed
// document (default/b), ready, staged and delivered messages on queue q, a
// pending transaction this island coordinates (x1, with a participant on
// island h1) and one prepared for island h2's coordinator (y1).
func fuzzPrelude() []*Command {
	held := &LeaseInfo{Namespace: "default", Key: "a", LeaseID: "lease-r1", TxnID: "t1"}
	b := &LeaseInfo{Namespace: "default", Key: "b", LeaseID: "lease-r3", TxnID: "t3"}
	enq := func(id, txn string) *Command {
		return &Command{Op: OpEnqueue, Enqueue: &EnqueueCmd{Namespace: "default", Queue: "q", ID: id, Visibility: 30_000,
			MaxAttempts: 2, TxnID: txn, Payload: []byte("payload-" + id)}}
	}
	return []*Command{
		{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "self", Voters: 1}},
		acq("a", "t1", "r1", 600_000, 0),
		acq("a", "t2", "r2", 600_000, 60_000),
		update(held, `{"staged":1}`),
		acq("b", "t3", "r3", 600_000, 0),
		update(b, `{"committed":1}`),
		release(b, false),
		enq("m1", ""), enq("m2", ""), enq("m3", "t1"),
		{Op: OpDequeue, Dequeue: &DequeueCmd{Namespace: "default", Queue: "q", Owner: "o", RequestID: "d1", LeaseID: "ql1",
			WithState: true, StateLease: "sl1", StateTxn: "st1"}},
		{Op: OpRMRegister, RMRegister: &RMRegisterCmd{Backend: "h1", Endpoint: "http://h1"}},
		{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: "x1", State: TxnPending, ExpiresAt: 1_600_000, Owner: "o", LeaseID: "xl1",
			Participants: []Participant{{Namespace: "default", Key: "c"}, {Namespace: "default", Key: "d", Backend: "h1"}}}},
		{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: "y1", Home: "h2", Term: 1, ExpiresAt: 1_600_000, Owner: "o", LeaseID: "yl1",
			Participants: []Participant{{Namespace: "default", Key: "e"}}}},
		utxoStep(UTXOPhaseLock, 0), utxoStep(UTXOPhaseRecord, 0), utxoStep(UTXOPhaseRecord, 1),
		utxoStep(UTXOPhaseChildren, 0), utxoStep(UTXOPhaseMaster, 0),
		{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{TxnID: "t1", TTL: 10_000, Spends: []UTXOSpendItem{{TxID: genTxIDs[0], Vout: 1,
			Hash: genHashes[0], Spender: genHashes[1]}}}},
	}
}

// utxoStep is a step of creating genTxIDs[0]: two records of two outputs.
func utxoStep(phase string, record int) *Command {
	c := &UTXOCreateCmd{Phase: phase, TxID: genTxIDs[0], Owner: "o", Records: 2, TTL: 30_000, Record: record,
		First: uint32(2 * record), Count: 2}
	if phase == UTXOPhaseRecord {
		var h [32]byte // genHashes[0]
		for i := range h {
			h[i] = 1
		}
		c.Outputs = []UTXOOut{{Vout: c.First, Hash: h, Sats: 5}, {Vout: c.First + 1, Hash: h, Sats: 6}}
		if record == 0 {
			c.Master = &UTXOMaster{Records: 2, Vouts: 4, Total: 4}
		}
	}
	return &Command{Op: OpUTXOCreate, UTXOCreate: c}
}

// fuzzSeeds are commands on the prelude's state: valid ones, stale ones and
// ones only a broken proposer would send.
func fuzzSeeds() []*Command {
	held := &LeaseInfo{Namespace: "default", Key: "a", LeaseID: "lease-r1", TxnID: "t1"}
	delivery := MessageRef{Namespace: "default", Queue: "q", ID: "m1", LeaseID: "ql1", Token: 1}
	v0 := int64(0)
	big := strings.Repeat("k", 40_000)
	return []*Command{
		acq("k", "t", "r", 1, 0),
		update(&LeaseInfo{Namespace: "n", Key: "k", LeaseID: "l"}, `{}`),
		sweep(),
		{Op: OpSweep, Now: 1 << 40, Sweep: &SweepCmd{Limit: 100, TxnRetention: 1}},
		{Op: OpNoop, Noop: &NoopCmd{}},
		acq("a", "t9", "r9", 1000, 5000),
		acq(big, "t9", "r9", 1000, 0),
		{Op: OpCancelWait, CancelWait: &CancelWaitCmd{Namespace: "default", Key: "a", RequestID: "r2"}},
		{Op: OpKeepAlive, KeepAlive: &KeepAliveCmd{Namespace: "default", Key: "a", LeaseID: "lease-r1", TxnID: "t1", Token: 1, TTL: 5000}},
		{Op: OpWrite, Write: &WriteCmd{Namespace: "default", Key: "a", LeaseID: "lease-r1", TxnID: "t1", IfVersion: &v0,
			ETag: "e", Doc: []byte(`{"x":1}`)}},
		{Op: OpWrite, Write: &WriteCmd{Namespace: "default", Key: "a", LeaseID: "lease-r1", TxnID: "t1", Delete: true}},
		release(held, false),
		release(held, true),
		{Op: OpEnqueue, Enqueue: &EnqueueCmd{Namespace: "default", Queue: "q", ID: "m9", Visibility: 1000, MaxAttempts: 1,
			Attributes: []byte(`{"a":1}`), Payload: []byte("p\n\x00")}},
		{Op: OpEnqueue, Enqueue: &EnqueueCmd{Namespace: "default", Queue: big, ID: big, Visibility: 1000, MaxAttempts: 1}},
		{Op: OpDequeue, Dequeue: &DequeueCmd{Namespace: "default", Queue: "q", Owner: "o", RequestID: "d9", LeaseID: "ql9", Wait: 1000}},
		{Op: OpDequeue, Dequeue: &DequeueCmd{Namespace: "default", Queue: "q.dlq", Owner: "o", RequestID: "d8", LeaseID: "ql8", TxnID: "x1"}},
		{Op: OpQCancel, QCancel: &QueueCancelCmd{Namespace: "default", Queue: "q", RequestID: "d9"}},
		{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: delivery}},
		{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: delivery, Delay: 100, LastError: []byte(`{"e":1}`)}},
		{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: delivery, Defer: true}},
		{Op: OpQExtend, QExtend: &QueueExtendCmd{MessageRef: delivery, By: 10_000}},
		{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "other", Voters: 3}},
		{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: "x1", State: TxnCommit, Prepared: []string{"h1"}}},
		{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: "t1", State: TxnRollback}},
		{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: "x2", State: TxnPending, ExpiresAt: 2_000_000, Owner: "o", LeaseID: "xl2",
			Participants: []Participant{{Namespace: "default", Key: "a"}}}},
		{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: "y2", Home: "h2", Term: 1, ExpiresAt: 2_000_000, LeaseID: "yl2",
			Participants: []Participant{{Namespace: "default", Key: "b"}}}},
		{Op: OpTxnRMApply, RMApply: &RMApplyCmd{TxnID: "y1", State: TxnCommit, Home: "h2", Term: 1,
			Participants: []Participant{{Namespace: "default", Key: "e"}}}},
		{Op: OpTxnRMApply, RMApply: &RMApplyCmd{TxnID: "y1", State: TxnRollback, Home: "h3", Term: 0}},
		{Op: OpTxnAck, Ack: &AckCmd{TxnID: "x1", Backends: []string{"h1"}}},
		{Op: OpRMRegister, RMRegister: &RMRegisterCmd{Backend: "h1", Endpoint: "http://h1", Remove: true}},
		{Op: OpRMRegister, RMRegister: &RMRegisterCmd{Backend: big[:128], Endpoint: big[:512]}},
		{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{Spends: []UTXOSpendItem{{TxID: genTxIDs[0], Vout: 0, Hash: genHashes[0],
			Spender: genHashes[0]}, {TxID: genTxIDs[0], Vout: 0, Hash: genHashes[0], Spender: genHashes[1]}}}},
		{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{Spends: []UTXOSpendItem{{TxID: genTxIDs[0], Vout: 1, Hash: genHashes[0],
			Spender: genHashes[0]}}}},
		{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: UTXOFreeze, Outpoints: []UTXOPoint{{TxID: genTxIDs[0], Vout: 2}}}},
		{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: UTXOReassign, NewHash: genHashes[1],
			Outpoints: []UTXOPoint{{TxID: genTxIDs[0], Vout: 3}}}},
		{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: UTXOMined, TxIDs: []string{genTxIDs[0], genTxIDs[1]}, BlockID: 1,
			Height: 10, OnLongestChain: true}},
		{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: UTXOHeight, Height: 1 << 31}},
		utxoStep(UTXOPhaseRecord, 1), utxoStep(UTXOPhaseLock, 0),
		{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: "t1", State: TxnCommit}},
		blockCmd(1, btx(1, 2), btx(2, 1, [2]int{1, 0})), blockCmd(2, btx(3, 1, [2]int{1, 1}), btx(4, 1, [2]int{9, 0})),
		{Op: OpUTXOBlock, UTXOBlock: &UTXOBlockCmd{Phase: BlockPhaseStage, Height: 3, Hash: blockHash(3), Txs: []BlockTx{btx(5, 1)}}},
		{Op: OpUTXOBlock, UTXOBlock: &UTXOBlockCmd{Phase: BlockPhaseApply, Height: 3, Hash: blockHash(3), Prev: blockHash(2), Chunks: 1}},
		rollbackCmd(1), rollbackCmd(0),
		{Op: OpUTXOPrune, UTXOPrune: &UTXOPruneCmd{Limit: 3, Retention: 1, Window: 1}},
		{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: UTXOConflicting, TxIDs: []string{genTxIDs[0]}, Value: true}},
	}
}
