package fsm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/raftlockd/raftlockd/errcode"
)

// Op names a state machine command.
type Op string

// The commands the state machine understands.
const (
	OpAcquire    Op = "acquire"
	OpCancelWait Op = "cancel_wait"
	OpKeepAlive  Op = "keepalive"
	OpWrite      Op = "write"
	OpRelease    Op = "release"
	OpSweep      Op = "sweep"
	OpNoop       Op = "noop"
	OpSetBackend Op = "set_backend"
	OpTxnDecide  Op = "txn_decide"
	OpTxnPrepare Op = "txn_prepare"
	OpTxnRMApply Op = "txn_rm_apply"
	OpTxnAck     Op = "txn_ack"
	OpRMRegister Op = "rm_register"
	OpEnqueue    Op = "enqueue"
	OpDequeue    Op = "dequeue"
	OpQCancel    Op = "queue_cancel"
	OpQAck       Op = "queue_ack"
	OpQNack      Op = "queue_nack"
	OpQExtend    Op = "queue_extend"
	OpRevoke     Op = "auth_revoke"
	OpTrust      Op = "tc_trust"
	OpUTXOCreate Op = "utxo_create"
	OpUTXOSpend  Op = "utxo_spend"
	OpUTXOUpdate Op = "utxo_update"
	OpUTXOBlock  Op = "utxo_block"
	OpUTXOPrune  Op = "utxo_prune"
	OpDropWaits  Op = "drop_waits"
	OpForgetKeys Op = "forget_keys"
)

// formatV1 is the first byte of every encoded command.
const formatV1 = 1

// formatPacked is the first byte of an entry that packs several encoded
// commands (EncodePacked). A leader packs the commands that arrive while its
// previous entry is on its way to the state machine into the next entry,
// so that they share one log append.
const formatPacked = 2

// formatV3 is the first byte of a command only builds of entry format 3
// apply (drop_waits); it is framed as formatV1. A node of an older build
// that meets one stops (apply) instead of skipping it and diverging.
const formatV3 = 3

// formatV4 is the first byte of a command only builds of entry format 4
// apply as this one does (a prune pass that keeps the block a rollback
// may reach, UTXOPruneCmd.KeepTip); it is framed as formatV1.
const formatV4 = 4

// formatV5 is the first byte of a command only builds of entry format 5
// apply (forget_keys); it is framed as formatV1.
const formatV5 = 5

// formatV6 is the first byte of a command only builds of entry format 6
// apply: a sweep that raises the island's rules to format 6 (SweepCmd.Format),
// from which on a message's state sidecar goes where the message goes. It
// is framed as formatV1.
const formatV6 = 6

// formatV7 is the first byte of a command only builds of entry format 7
// apply: a sweep that raises the island's rules to format 7, from which on
// a decide on a decided transaction adds the other islands it names to the
// record and sends them the decision. It is framed as formatV1.
const formatV7 = 7

// formatV8 is the first byte of a command only builds of entry format 8
// apply: a sweep that raises the island's rules to format 8, from which on
// a decision record notes when every island had applied it (DoneAt), and
// the record's retention counts from that moment alone. It is framed as
// formatV1.
const formatV8 = 8

// formatV9 is the first byte of a command only builds of entry format 9
// apply: a sweep that raises the island's rules to format 9, from which on
// an acknowledgement without the state lease drops the message's sidecar
// too, a nack of a delivery enlisted in a transaction requeues the message
// as the nack asks (defer, delay, last error), a prune pass keeps the
// record of the lowest block a rollback can still reach and every
// transaction an output of which a pending two-phase spend reserves, and a
// block and a mined mark name a block by its id and height together. It is
// framed as formatV1.
const formatV9 = 9

// formatV10 is the first byte of a command only builds of entry format 10
// apply: a sweep that raises the island's rules to format 10, from which on
// a keepalive bounds the lease's TTL by the maximum it carries
// (KeepAliveCmd.Max, the proposing server's --max-ttl), so that a lease
// acquired under a longer maximum is not kept alive beyond the one in
// force, and a write whose ETag condition was given as the empty ETag
// (WriteCmd.IfETagSet with IfETag "": X-If-State-ETag: "") requires the
// holder's view to hold no document, as lockd compares it (before, such a
// condition was not checked). It is framed as formatV1.
const formatV10 = 10

// formatV11 is the first byte of a command only builds of entry format 11
// apply: a sweep that raises the island's rules to format 11, from which on
// a nack of a delivery whose transaction another island's coordinator
// decides is noted on the delivery (MessageLease.Nack), so that the
// coordinator's rollback requeues the message as the nack asked and records
// the delivery as nacked (a retried nack is answered as the first); a
// withdrawn acquire whose request was granted a lease that has run out
// since is answered as withdrawn, not with that lease; and a dead letter
// that replaces one in flight with its id ends that one's delivery; and a
// staged UTXO create over the records of an unfinished creation outside any
// transaction is refused (tx_exists). It is framed as formatV1.
const formatV11 = 11

// formatV12 is the first byte of a command only builds of entry format 12
// apply: a sweep that raises the island's rules to format 12, from which on
// a sweep ends the acquires and dequeues whose wait is over before it
// expires anything, so that a lease or delivery it expires hands its key
// or message on without walking past waits that ended (work its budget
// does not count), and one sweep entry stays a bounded step however many
// requests waited on one key or queue. It is framed as formatV1.
const formatV12 = 12

// formatV13 is the first byte of a command only builds of entry format 13
// apply: a sweep that raises the island's rules to format 13, from which on
// the island notes how recent the transaction records it forgot were
// (metaTxnForgot), and a prepare of a transaction it has no record of (or a
// pending or commit decision of its coordinator that names its own
// participants) whose id was minted before that rolls the transaction back
// instead of locking the participants: the island may have rolled the
// transaction back and forgotten it, and its other islands must not commit
// it alone. It is framed as formatV1.
const formatV13 = 13

// formatV14 is the first byte of a command only builds of entry format 14
// apply: a sweep that raises the island's rules to format 14, from which on
// a commit another island's coordinator sends for a transaction the island
// has no record of, naming its participants, rolls the transaction back as
// a prepare of it would (forgotten) instead of recording the commit, and
// an acknowledgement notes the islands that had decided the transaction
// the other way (AckCmd.Refused). It is framed as formatV1.
const formatV14 = 14

// EntryFormat is the newest entry format this build applies. Nodes announce
// it; a leader packs commands, and a server proposes drop_waits, prune
// passes that keep the tip and forget_keys, only when every server
// announces it (gossip); an entry of a newer format stops the node (apply).
const EntryFormat = formatV14

// format is the first byte of c's encoding: the oldest entry format whose
// builds apply c as this one does.
func (c *Command) format() byte {
	switch {
	case c.Sweep != nil && c.Sweep.Format >= formatV14:
		return formatV14
	case c.Sweep != nil && c.Sweep.Format >= formatV13:
		return formatV13
	case c.Sweep != nil && c.Sweep.Format >= formatV12:
		return formatV12
	case c.Sweep != nil && c.Sweep.Format >= formatV11:
		return formatV11
	case c.Sweep != nil && c.Sweep.Format >= formatV10:
		return formatV10
	case c.Sweep != nil && c.Sweep.Format >= formatV9:
		return formatV9
	case c.Sweep != nil && c.Sweep.Format >= formatV8:
		return formatV8
	case c.Sweep != nil && c.Sweep.Format >= formatV7:
		return formatV7
	case c.Sweep != nil && c.Sweep.Format >= formatV6:
		return formatV6
	case c.ForgetKeys != nil:
		return formatV5
	case c.UTXOPrune != nil && c.UTXOPrune.KeepTip:
		return formatV4
	case c.DropWaits != nil:
		return formatV3
	}
	return formatV1
}

// MaxPacked bounds the commands of one packed entry.
const MaxPacked = 1 << 16

// Command is one replicated instruction. Everything Apply needs is inside it:
// the leader stamps Now (Unix milliseconds) just before proposing and the
// proposer mints every identifier, so Apply never reads a clock or a random
// source. Exactly one of the operation fields is set, matching Op.
type Command struct {
	Op         Op              `json:"op"`
	Now        int64           `json:"now"`
	Acquire    *AcquireCmd     `json:"acquire,omitempty"`
	CancelWait *CancelWaitCmd  `json:"cancel_wait,omitempty"`
	KeepAlive  *KeepAliveCmd   `json:"keepalive,omitempty"`
	Write      *WriteCmd       `json:"write,omitempty"`
	Release    *ReleaseCmd     `json:"release,omitempty"`
	Sweep      *SweepCmd       `json:"sweep,omitempty"`
	Noop       *NoopCmd        `json:"noop,omitempty"`
	SetBackend *SetBackendCmd  `json:"set_backend,omitempty"`
	Decide     *DecideCmd      `json:"decide,omitempty"`
	Prepare    *PrepareCmd     `json:"prepare,omitempty"`
	RMApply    *RMApplyCmd     `json:"rm_apply,omitempty"`
	Ack        *AckCmd         `json:"ack,omitempty"`
	RMRegister *RMRegisterCmd  `json:"rm_register,omitempty"`
	Enqueue    *EnqueueCmd     `json:"enqueue,omitempty"`
	Dequeue    *DequeueCmd     `json:"dequeue,omitempty"`
	QCancel    *QueueCancelCmd `json:"queue_cancel,omitempty"`
	QAck       *QueueAckCmd    `json:"queue_ack,omitempty"`
	QNack      *QueueNackCmd   `json:"queue_nack,omitempty"`
	QExtend    *QueueExtendCmd `json:"queue_extend,omitempty"`
	Revoke     *RevokeCmd      `json:"auth_revoke,omitempty"`
	Trust      *TrustCmd       `json:"tc_trust,omitempty"`
	UTXOCreate *UTXOCreateCmd  `json:"utxo_create,omitempty"`
	UTXOSpend  *UTXOSpendCmd   `json:"utxo_spend,omitempty"`
	UTXOUpdate *UTXOUpdateCmd  `json:"utxo_update,omitempty"`
	UTXOBlock  *UTXOBlockCmd   `json:"utxo_block,omitempty"`
	UTXOPrune  *UTXOPruneCmd   `json:"utxo_prune,omitempty"`
	DropWaits  *DropWaitsCmd   `json:"drop_waits,omitempty"`
	ForgetKeys *ForgetKeysCmd  `json:"forget_keys,omitempty"`
}

// AcquireCmd grants a lease on a key, or queues the caller behind the holder.
type AcquireCmd struct {
	Namespace   string `json:"ns"`
	Key         string `json:"key"`
	Owner       string `json:"owner"`
	TxnID       string `json:"txn"`
	LeaseID     string `json:"lease"`
	RequestID   string `json:"req"`
	TTL         int64  `json:"ttl"`            // milliseconds, > 0
	Wait        int64  `json:"wait,omitempty"` // milliseconds; 0 never queues
	IfNotExists bool   `json:"if_not_exists,omitempty"`
	// Attempt names this attempt of the request (a retry carries the
	// RequestID of the first attempt and an Attempt of its own). A retry
	// that finds the request queued takes the queued place over.
	Attempt string `json:"attempt,omitempty"`
	// Node is the server where the requester waits, so that the leader can
	// tell it of a grant at once; Run is that server's run (DropWaitsCmd).
	Node string `json:"node,omitempty"`
	Run  string `json:"run,omitempty"`
}

// CancelWaitCmd withdraws a queued acquire whose caller stopped waiting. It
// withdraws it only while Attempt is the attempt that last took the queued
// place: a cancel from an attempt a retry replaced changes nothing.
type CancelWaitCmd struct {
	Namespace string `json:"ns"`
	Key       string `json:"key"`
	RequestID string `json:"req"`
	Attempt   string `json:"attempt,omitempty"`
}

// KeepAliveCmd extends a lease.
type KeepAliveCmd struct {
	Namespace string `json:"ns"`
	Key       string `json:"key"`
	LeaseID   string `json:"lease"`
	TxnID     string `json:"txn,omitempty"`
	Token     int64  `json:"token,omitempty"` // 0: not checked
	TTL       int64  `json:"ttl,omitempty"`   // milliseconds; 0 keeps the lease's TTL
	// Max is the longest TTL (milliseconds) the proposing server allows
	// (--max-ttl); 0: none. From rules format 10 on, a lease whose TTL is
	// longer (acquired under a longer maximum) is kept alive for Max, its
	// TTL from then on; before, builds ignore it.
	Max int64 `json:"max,omitempty"`
}

// WriteCmd stages a new document (or a removal) under the lease's transaction.
type WriteCmd struct {
	Namespace string `json:"ns"`
	Key       string `json:"key"`
	LeaseID   string `json:"lease"`
	TxnID     string `json:"txn,omitempty"`
	Token     int64  `json:"token,omitempty"`      // 0: not checked
	IfVersion *int64 `json:"if_version,omitempty"` // nil: not checked
	IfETag    string `json:"if_etag,omitempty"`    // "": not checked, unless IfETagSet
	// IfETagSet says the ETag condition was given even when IfETag is
	// empty: the holder's view must then hold no document. Applied from
	// the rules of format 10 on; builds before ignore it.
	IfETagSet bool   `json:"if_etag_set,omitempty"`
	Delete    bool   `json:"delete,omitempty"`
	ETag      string `json:"etag,omitempty"` // of Doc, computed by the proposer
	Doc       []byte `json:"-"`              // compact JSON, carried after the header
}

// ReleaseCmd ends a lease's transaction: commit, or roll back.
type ReleaseCmd struct {
	Namespace string `json:"ns"`
	Key       string `json:"key"`
	LeaseID   string `json:"lease"`
	TxnID     string `json:"txn,omitempty"`
	Token     int64  `json:"token,omitempty"`
	Rollback  bool   `json:"rollback,omitempty"`
}

// SweepCmd expires what is due at Now: leases (rolling back their
// transactions), queued acquirers past their deadline, and decision records
// older than TxnRetention. Limit bounds the work done by one entry.
type SweepCmd struct {
	Limit        int   `json:"limit"`
	TxnRetention int64 `json:"txn_retention"` // milliseconds
	// Format, when set, is an entry format every server applies: the
	// island follows its rules from this sweep on (metaRules, never
	// lowered). The leader sets it once every server announces it.
	Format int `json:"format,omitempty"`
}

// NoopCmd changes nothing but the applied index. A new leader proposes one
// before serving reads, so that everything committed before its term is
// known to be applied.
type NoopCmd struct{}

// SetBackendCmd names the island and records its size: the first Hash
// applied sets the cluster's backend hash for good (later ones change
// nothing), and Voters raises the island's voter high-water mark (the most
// voters its leaders have seen alive), which never goes down. At least one
// of the two is set.
type SetBackendCmd struct {
	Hash   string `json:"hash,omitempty"`
	Voters int    `json:"voters,omitempty"`
}

// Encode frames c as a format byte, its JSON header, a newline and the raw
// document of a write (JSON never holds a raw newline, so the first one ends
// the header). The document is not re-escaped, which keeps large states cheap.
func Encode(c *Command) ([]byte, error) {
	h, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("fsm: encode %s: %w", c.Op, err)
	}
	var doc []byte
	switch {
	case c.Write != nil:
		doc = c.Write.Doc
	case c.Enqueue != nil:
		doc = c.Enqueue.Payload
	case c.UTXOCreate != nil:
		doc = EncodeUTXOOuts(c.UTXOCreate.Outputs)
	case c.UTXOBlock != nil:
		doc = EncodeBlockTxs(c.UTXOBlock.Txs)
	}
	out := make([]byte, 0, 2+len(h)+len(doc))
	out = append(out, c.format())
	out = append(out, h...)
	out = append(out, '\n')
	return append(out, doc...), nil
}

// EncodePacked frames encoded commands (each from Encode) as one entry:
// the format byte, the count, then each command's length and bytes, all
// lengths as unsigned varints. The state machine applies them in order, as
// it would the same commands in entries of their own, and answers Results.
func EncodePacked(cmds [][]byte) []byte {
	size := 1 + binary.MaxVarintLen64
	for _, c := range cmds {
		size += binary.MaxVarintLen64 + len(c)
	}
	out := make([]byte, 0, size)
	out = append(out, formatPacked)
	out = binary.AppendUvarint(out, uint64(len(cmds)))
	for _, c := range cmds {
		out = binary.AppendUvarint(out, uint64(len(c)))
		out = append(out, c...)
	}
	return out
}

// unpack splits an entry made by EncodePacked into its commands. It
// rejects any other framing with errcode.MalformedCmd and never panics.
func unpack(data []byte) ([][]byte, error) {
	if len(data) < 1 || data[0] != formatPacked {
		return nil, errcode.MalformedCmd.With("not a packed entry")
	}
	rest := data[1:]
	n, k := binary.Uvarint(rest)
	if k <= 0 || n == 0 || n > MaxPacked {
		return nil, errcode.MalformedCmd.With("bad command count in packed entry")
	}
	rest = rest[k:]
	cmds := make([][]byte, 0, n)
	for range n {
		l, k := binary.Uvarint(rest)
		if k <= 0 || l > uint64(len(rest)-k) {
			return nil, errcode.MalformedCmd.With("truncated packed entry")
		}
		cmds = append(cmds, rest[k:k+int(l)])
		rest = rest[k+int(l):]
	}
	if len(rest) != 0 {
		return nil, errcode.MalformedCmd.With("trailing bytes after packed entry")
	}
	return cmds, nil
}

// EntryBackend returns the backend hash that a log entry's data (one
// encoded command or a packed entry) names the island with, "" when it
// names none. Only the first such entry applied names the island.
func EntryBackend(data []byte) string {
	cmds := [][]byte{data}
	if len(data) > 0 && data[0] == formatPacked {
		var err error
		if cmds, err = unpack(data); err != nil {
			return ""
		}
	}
	for _, raw := range cmds {
		c, err := Decode(raw)
		if err == nil && c.Op == OpSetBackend && c.SetBackend.valid() && c.SetBackend.Hash != "" {
			return c.SetBackend.Hash
		}
	}
	return ""
}

// Decode parses an encoded command. It rejects anything Encode would not have
// produced, with errcode.MalformedCmd, and never panics.
func Decode(data []byte) (*Command, error) {
	if len(data) < 2 || (data[0] != formatV1 && (data[0] < formatV3 || data[0] > EntryFormat)) {
		return nil, errcode.MalformedCmd.With("unknown command format")
	}
	// The header ends at the first newline after the format byte (which,
	// from format 10 on, may be a newline itself).
	i := bytes.IndexByte(data[1:], '\n') + 1
	if i < 1 {
		return nil, errcode.MalformedCmd.With("missing header terminator")
	}
	var c Command
	if err := json.Unmarshal(data[1:i], &c); err != nil {
		return nil, errcode.MalformedCmd.With("%v", err)
	}
	payload := data[i+1:]
	set := 0
	for _, p := range []bool{c.Acquire != nil, c.CancelWait != nil, c.KeepAlive != nil, c.Write != nil, c.Release != nil,
		c.Sweep != nil, c.Noop != nil, c.SetBackend != nil, c.Decide != nil, c.Prepare != nil, c.RMApply != nil,
		c.Ack != nil, c.RMRegister != nil, c.Enqueue != nil, c.Dequeue != nil, c.QCancel != nil, c.QAck != nil,
		c.QNack != nil, c.QExtend != nil, c.Revoke != nil, c.Trust != nil, c.UTXOCreate != nil, c.UTXOSpend != nil,
		c.UTXOUpdate != nil, c.UTXOBlock != nil, c.UTXOPrune != nil, c.DropWaits != nil,
		c.ForgetKeys != nil} {
		if p {
			set++
		}
	}
	if set != 1 {
		return nil, errcode.MalformedCmd.With("command must carry exactly one operation")
	}
	var ok bool
	switch c.Op {
	case OpAcquire:
		ok = c.Acquire != nil
	case OpCancelWait:
		ok = c.CancelWait != nil
	case OpKeepAlive:
		ok = c.KeepAlive != nil
	case OpWrite:
		ok = c.Write != nil
	case OpRelease:
		ok = c.Release != nil
	case OpSweep:
		ok = c.Sweep != nil
	case OpNoop:
		ok = c.Noop != nil
	case OpSetBackend:
		ok = c.SetBackend != nil
	case OpTxnDecide:
		ok = c.Decide != nil
	case OpTxnPrepare:
		ok = c.Prepare != nil
	case OpTxnRMApply:
		ok = c.RMApply != nil
	case OpTxnAck:
		ok = c.Ack != nil
	case OpRMRegister:
		ok = c.RMRegister != nil
	case OpEnqueue:
		ok = c.Enqueue != nil
	case OpDequeue:
		ok = c.Dequeue != nil
	case OpQCancel:
		ok = c.QCancel != nil
	case OpQAck:
		ok = c.QAck != nil
	case OpQNack:
		ok = c.QNack != nil
	case OpQExtend:
		ok = c.QExtend != nil
	case OpRevoke:
		ok = c.Revoke != nil
	case OpTrust:
		ok = c.Trust != nil
	case OpUTXOCreate:
		ok = c.UTXOCreate != nil
	case OpUTXOSpend:
		ok = c.UTXOSpend != nil
	case OpUTXOUpdate:
		ok = c.UTXOUpdate != nil
	case OpUTXOBlock:
		ok = c.UTXOBlock != nil
	case OpUTXOPrune:
		ok = c.UTXOPrune != nil
	case OpDropWaits:
		ok = c.DropWaits != nil
	case OpForgetKeys:
		ok = c.ForgetKeys != nil
	default:
		return nil, errcode.UnknownCmd.With("%q", c.Op)
	}
	if !ok {
		return nil, errcode.MalformedCmd.With("op %q does not match its body", c.Op)
	}
	if data[0] != c.format() {
		return nil, errcode.MalformedCmd.With("op %q in a command of format %d", c.Op, data[0])
	}
	switch {
	case c.Write != nil && !c.Write.Delete:
		c.Write.Doc = bytes.Clone(payload)
	case c.Enqueue != nil:
		c.Enqueue.Payload = bytes.Clone(payload)
	case c.UTXOCreate != nil:
		outs, ok := decodeUTXOOuts(payload)
		if !ok {
			return nil, errcode.MalformedCmd.With("bad utxo outputs")
		}
		c.UTXOCreate.Outputs = outs
	case c.UTXOBlock != nil:
		txs, ok := decodeBlockTxs(payload)
		if !ok {
			return nil, errcode.MalformedCmd.With("bad block transactions")
		}
		c.UTXOBlock.Txs = txs
	case len(payload) > 0:
		return nil, errcode.MalformedCmd.With("unexpected payload")
	}
	return &c, nil
}
