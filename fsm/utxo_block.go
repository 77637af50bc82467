package fsm

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"slices"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// Blocks: a whole block applied, or a run of blocks undone, in one step.
//
// Applying a block creates its transactions, spends their inputs (the
// block's transactions are the spenders), marks transactions that already
// existed as mined, moves the chain height and records an undo delta and
// the block itself, all in one Raft entry and so one bbolt transaction. A
// block too large for one entry is first staged in chunks that nothing
// reads (utxo_bstage) and then applied by a small entry that names them:
// no part of it is visible before the whole is.
//
// The apply is planned before anything is written (planBlock): every
// outpoint the block reads is fetched in one pass in key order, the
// block's own outputs are created in memory, and every spend is checked
// against that plan. A failing input rejects the block with the codes of
// all failing inputs and changes nothing.
//
// A rollback replays the deltas of the blocks above the target height,
// newest first: outputs the block spent become unspent with their data as
// it was, transactions it created are deleted, and transactions it only
// marked mined lose that block and, with no block left, become unmined.

var (
	bucketUTXOBlocks = []byte("utxo_blocks") // height(4) -> BlockInfo
	bucketUTXOUndo   = []byte("utxo_undo")   // height(4) -> undo delta (binary)
	bucketUTXOStage  = []byte("utxo_bstage") // height(4)|hash(32)|chunk(4) -> encoded txs
	metaUTXOBlockSeq = []byte("utxo_block_seq")
)

// Phases of a block command.
const (
	BlockPhaseStage    = "stage"    // keep one chunk of a block's transactions
	BlockPhaseApply    = "apply"    // apply the block (its txs inline or staged)
	BlockPhaseRollback = "rollback" // undo blocks above Height
)

// UTXOBlockCmd applies a block, stages part of one, or rolls blocks back.
type UTXOBlockCmd struct {
	Phase     string    `json:"phase"`
	Height    uint32    `json:"height"`
	Hash      string    `json:"hash,omitempty"`
	Prev      string    `json:"prev,omitempty"`
	Chunk     int       `json:"chunk,omitempty"`
	Chunks    int       `json:"chunks,omitempty"` // apply: staged chunks; 0 when the txs are inline
	Retention uint32    `json:"retention,omitempty"`
	Window    uint32    `json:"window,omitempty"`
	Txs       []BlockTx `json:"-"` // carried in the payload
}

// BlockTx is one transaction of a block.
type BlockTx struct {
	TxID     [32]byte
	Coinbase bool
	Inputs   []BlockIn
	Outputs  []UTXOOut
}

// BlockIn is an input of a block transaction: the output it spends.
type BlockIn struct {
	TxID [32]byte
	Vout uint32
	Hash [32]byte
}

// BlockInfo describes an applied block.
type BlockInfo struct {
	Height  uint32 `json:"height"`
	Hash    string `json:"hash"`
	Prev    string `json:"prev"`
	ID      uint32 `json:"id"`
	Txs     int    `json:"txs"`
	Created int    `json:"created"`
	Mined   int    `json:"mined"`
	Spent   int    `json:"spent"`
	At      int64  `json:"at"`
}

// BlockResult reports a block command.
type BlockResult struct {
	Applied *BlockInfo `json:"applied,omitempty"`
	// AlreadyApplied is set when the block was the one applied at its
	// height: nothing changed.
	AlreadyApplied bool        `json:"already_applied,omitempty"`
	Undone         []BlockInfo `json:"undone,omitempty"`
	Height         uint32      `json:"height"`
}

const (
	blockTxHead = 32 + 1 + 4 + 4
	blockInSize = 32 + 4 + 32
	maxBlockTxs = 1 << 22
)

// BlockTxBytes is the size of t in a block command's payload.
func BlockTxBytes(t BlockTx) int {
	return blockTxHead + len(t.Inputs)*blockInSize + len(t.Outputs)*utxoOutBytes
}

// EncodeBlockTxs packs transactions as the payload of a block command.
func EncodeBlockTxs(txs []BlockTx) []byte {
	n := 0
	for _, t := range txs {
		n += BlockTxBytes(t)
	}
	b := make([]byte, 0, n)
	for _, t := range txs {
		b = append(b, t.TxID[:]...)
		cb := byte(0)
		if t.Coinbase {
			cb = 1
		}
		b = append(b, cb)
		b = binary.BigEndian.AppendUint32(b, uint32(len(t.Inputs)))
		b = binary.BigEndian.AppendUint32(b, uint32(len(t.Outputs)))
		for _, in := range t.Inputs {
			b = append(b, in.TxID[:]...)
			b = binary.BigEndian.AppendUint32(b, in.Vout)
			b = append(b, in.Hash[:]...)
		}
		b = append(b, EncodeUTXOOuts(t.Outputs)...)
	}
	return b
}

func decodeBlockTxs(b []byte) ([]BlockTx, bool) {
	var txs []BlockTx
	for len(b) > 0 {
		if len(b) < blockTxHead || b[32] > 1 || len(txs) >= maxBlockTxs {
			return nil, false
		}
		var t BlockTx
		copy(t.TxID[:], b)
		t.Coinbase = b[32] == 1
		nIn, nOut := uint64(binary.BigEndian.Uint32(b[33:])), uint64(binary.BigEndian.Uint32(b[37:]))
		b = b[blockTxHead:]
		if nIn*blockInSize+nOut*utxoOutBytes > uint64(len(b)) {
			return nil, false
		}
		t.Inputs = make([]BlockIn, nIn)
		for i := range t.Inputs {
			copy(t.Inputs[i].TxID[:], b)
			t.Inputs[i].Vout = binary.BigEndian.Uint32(b[32:])
			copy(t.Inputs[i].Hash[:], b[36:])
			b = b[blockInSize:]
		}
		outs, _ := decodeUTXOOuts(b[:nOut*utxoOutBytes])
		t.Outputs = outs
		b = b[nOut*utxoOutBytes:]
		txs = append(txs, t)
	}
	return txs, true
}

func u32Key(h uint32) []byte { return binary.BigEndian.AppendUint32(nil, h) }

func (r reader) blockAt(h uint32) *BlockInfo {
	var b BlockInfo
	if !r.getJSON(bucketUTXOBlocks, u32Key(h), &b) {
		return nil
	}
	return &b
}

func (r reader) tipBlock() *BlockInfo {
	k, v := r.b(bucketUTXOBlocks).Cursor().Last()
	if k == nil {
		return nil
	}
	var b BlockInfo
	must(json.Unmarshal(v, &b))
	return &b
}

func (s *applyState) utxoBlock(c *UTXOBlockCmd) *Result {
	switch c.Phase {
	case BlockPhaseStage:
		return s.stageBlock(c)
	case BlockPhaseApply:
		return s.applyBlock(c)
	case BlockPhaseRollback:
		return s.rollbackBlocks(c)
	}
	return fail(errcode.MalformedCmd.With("unknown block phase %q", c.Phase))
}

func stageKey(h uint32, hash []byte, chunk int) []byte {
	return binary.BigEndian.AppendUint32(append(u32Key(h), hash...), uint32(chunk))
}

func (s *applyState) stageBlock(c *UTXOBlockCmd) *Result {
	hash, ok := txidBytes(c.Hash)
	if !ok || c.Chunk < 0 || c.Chunk >= 1<<16 || len(c.Txs) == 0 {
		return fail(errcode.MalformedCmd.With("bad block chunk"))
	}
	if tip := s.tipBlock(); tip != nil && c.Height <= tip.Height {
		if b := s.blockAt(c.Height); b != nil && b.Hash == c.Hash {
			return &Result{UTXO: &UTXOResult{Block: &BlockResult{AlreadyApplied: true, Height: s.utxoHeight()}}}
		}
	}
	s.put(bucketUTXOStage, stageKey(c.Height, hash, c.Chunk), EncodeBlockTxs(c.Txs))
	return &Result{UTXO: &UTXOResult{Block: &BlockResult{Height: s.utxoHeight()}}}
}

// blockPlan is a block ready to be written: every transaction it touches,
// read once, changed in memory.
type blockPlan struct {
	b          *utxoBatch
	created    [][]byte        // txids the block creates, in block order
	mined      [][]byte        // txids that existed and are marked mined
	unfinished [][]byte        // of those, the ones whose creation the block completes
	spent      [][]byte        // outpoints (txid|vout) the block spends, in order
	spenders   [][]byte        // the spender (txid|vin) of each of spent
	records    []plannedRecord // missing records of unfinished creations
	fails      []errcode.Item
}

// planBlock checks a block against the state at height and builds its
// plan. It writes nothing.
func (s *applyState) planBlock(txs []BlockTx, height, id uint32) *blockPlan {
	p := &blockPlan{b: newUTXOBatch(s)}
	b := p.b
	// One pass, in key order, over every master and output the block
	// reads from the state.
	var masters, outs [][]byte
	inBlock := make(map[[32]byte]int, len(txs))
	for i, t := range txs {
		if _, dup := inBlock[t.TxID]; dup {
			p.fails = append(p.fails, errcode.Item{Index: i, Code: wire.UTXOTxExists, TxID: hex.EncodeToString(t.TxID[:])})
			continue
		}
		inBlock[t.TxID] = i
		masters = append(masters, t.TxID[:])
		for _, in := range t.Inputs {
			masters = append(masters, in.TxID[:])
			outs = append(outs, recKey(in.TxID[:], in.Vout))
		}
	}
	dups := len(p.fails)
	b.prefetch(masters, outs)

	for i, t := range txs {
		if inBlock[t.TxID] != i {
			continue // listed again: its failure is the repetition
		}
		txid := t.TxID[:]
		idHex := hex.EncodeToString(txid)
		// The transaction itself: created, or marked mined if it exists.
		if rec := b.master(txid); rec != nil {
			if code := minedCheck(rec); code != "" {
				p.fails = append(p.fails, errcode.Item{Index: i, Code: code, TxID: idHex})
				continue
			}
			m := rec.Master
			if !m.inBlock(id, height, s.rules() >= formatV9) {
				m.BlockIDs = append(m.BlockIDs, id)
				m.BlockHeights = append(m.BlockHeights, height)
				m.SubtreeIdxs = append(m.SubtreeIdxs, 0)
			}
			m.UnminedSince = nil
			if rec.Creating {
				// The block, which carries every output, completes its
				// creation: missing records are written and creating is
				// cleared (finishMined); the rest of the block may spend it.
				p.complete(s, txid, rec, t)
				rec.Creating = false
				p.unfinished = append(p.unfinished, txid)
			}
			b.touchMaster(txid)
			p.mined = append(p.mined, txid)
		} else {
			if code := p.create(t, height, id, s.now); code != "" {
				p.fails = append(p.fails, errcode.Item{Index: i, Code: code, TxID: idHex})
				continue
			}
			p.created = append(p.created, txid)
		}
		for vin, in := range t.Inputs {
			if code, o := p.spend(s, in, idHex, uint32(vin), height, inBlock, i); code != "" {
				it := errcode.Item{Index: i, Code: code, TxID: idHex}
				v := uint32(vin)
				it.Input = &v
				if code == wire.UTXOSpent && o != nil {
					ov := o.Vin
					it.SpendingTxID, it.Vin = o.Spender, &ov
				}
				p.fails = append(p.fails, it)
			}
		}
	}
	if dups > 0 {
		slices.SortStableFunc(p.fails, func(a, b errcode.Item) int { return cmp.Compare(a.Index, b.Index) })
	}
	return p
}

// plannedRecord is a record a block writes to complete a creation.
type plannedRecord struct {
	txid    []byte
	idx     uint32
	rec     *UTXORecord
	outputs int
}

// complete plans the records of an unfinished creation that are missing,
// laid out as the creator lays them out (record i holds the vouts from
// i*count, count being record 0's), with the block's outputs they hold.
// Records present are left as they are.
func (p *blockPlan) complete(s *applyState, txid []byte, rec *UTXORecord, t BlockTx) {
	m, batch := rec.Master, rec.Count
	if batch == 0 {
		return
	}
	for i := 1; i < m.Records; i++ {
		first := uint64(i) * uint64(batch)
		if first >= uint64(m.Vouts) || s.b(bucketUTXORecs).Get(recKey(txid, uint32(i))) != nil {
			continue
		}
		r := plannedRecord{txid: txid, idx: uint32(i),
			rec: &UTXORecord{First: uint32(first), Count: uint32(min(uint64(batch), uint64(m.Vouts)-first))}}
		for _, o := range t.Outputs {
			if uint64(o.Vout) < first || uint64(o.Vout) >= first+uint64(r.rec.Count) {
				continue
			}
			k := string(recKey(txid, o.Vout))
			p.b.outs[k] = &utxoOutput{Hash: hex.EncodeToString(o.Hash[:]), Sats: o.Sats}
			p.b.touchOutKey(k)
			r.outputs++
		}
		p.records = append(p.records, r)
	}
}

// minedCheck refuses to mark mined a transaction a two-phase transaction
// is still creating.
func minedCheck(rec *UTXORecord) string {
	if rec.Master.StagedBy != "" {
		return wire.UTXOLockedPrefix + rec.Master.StagedBy
	}
	return ""
}

// create adds a transaction of the block to the plan, mined at height.
func (p *blockPlan) create(t BlockTx, height, id uint32, now int64) string {
	vouts := uint32(0)
	for j, o := range t.Outputs {
		if j > 0 && o.Vout <= t.Outputs[j-1].Vout {
			return wire.UTXOInvalid
		}
		vouts = o.Vout + 1
	}
	if len(t.Outputs) > 0 && (t.Outputs[len(t.Outputs)-1].Vout >= maxRecordVouts) {
		return wire.UTXOInvalid
	}
	m := &UTXOMaster{Records: 1, Vouts: vouts, Total: len(t.Outputs), Coinbase: t.Coinbase, Height: height,
		BlockIDs: []uint32{id}, BlockHeights: []uint32{height}, SubtreeIdxs: []int32{0}, CreatedAt: now}
	for _, in := range t.Inputs {
		m.Inputs = append(m.Inputs, UTXOPoint{TxID: hex.EncodeToString(in.TxID[:]), Vout: in.Vout})
	}
	txid := t.TxID[:]
	p.b.masters[string(txid)] = &UTXORecord{First: 0, Count: max(vouts, 1), Master: m}
	p.b.touchMaster(txid)
	for _, o := range t.Outputs {
		k := string(recKey(txid, o.Vout))
		p.b.outs[k] = &utxoOutput{Hash: hex.EncodeToString(o.Hash[:]), Sats: o.Sats}
		p.b.touchOutKey(k)
	}
	return ""
}

// spend spends one input of the block's transaction i in the plan.
func (p *blockPlan) spend(s *applyState, in BlockIn, spender string, vin, height uint32, inBlock map[[32]byte]int, i int) (string, *utxoOutput) {
	ptx := in.TxID[:]
	if j, ok := inBlock[in.TxID]; ok && j >= i {
		return wire.UTXONotFound, nil // created later in the block, or by itself
	}
	m := p.b.master(ptx)
	if code := s.txCheck(m, "", true, false, height); code != "" {
		return code, nil
	}
	o, code := p.b.outpoint(m, ptx, in.Vout, hex.EncodeToString(in.Hash[:]))
	if code == "" && o.SpendableAt > height {
		code = wire.UTXOFrozenUntil
	}
	if code != "" {
		return code, o
	}
	same := o.Spent && o.Spender == spender && o.Vin == vin
	switch {
	case same && slices.Contains(m.Master.DeletedChildren, spender):
		return wire.UTXOInvalidSpend, o
	case same:
		return "", nil // spent by this transaction before it was mined
	case o.Frozen:
		return wire.UTXOFrozen, o
	case o.Rsv != nil:
		return wire.UTXOLockedPrefix + o.Rsv.Txn, o
	case o.Spent:
		return wire.UTXOSpent, o
	}
	o.Spent, o.Spender, o.Vin = true, spender, vin
	m.Master.Spent++
	p.b.touchOut(ptx, in.Vout)
	p.b.touchMaster(ptx)
	p.spent = append(p.spent, recKey(ptx, in.Vout))
	sp, _ := hex.DecodeString(spender)
	p.spenders = append(p.spenders, binary.BigEndian.AppendUint32(sp, vin))
	return "", nil
}

// prefetch reads the given masters and outputs into the batch in one pass
// in key order.
func (b *utxoBatch) prefetch(masters, outs [][]byte) {
	sortUnique := func(ks [][]byte) [][]byte {
		slices.SortFunc(ks, bytes.Compare)
		return slices.CompactFunc(ks, bytes.Equal)
	}
	c := b.s.b(bucketUTXORecs).Cursor()
	for _, txid := range sortUnique(masters) {
		if _, ok := b.masters[string(txid)]; ok {
			continue
		}
		var rec *UTXORecord
		if k, v := c.Seek(recKey(txid, 0)); k != nil && bytes.Equal(k, recKey(txid, 0)) {
			var r UTXORecord
			must(decodeRecord(v, &r))
			if r.Master != nil {
				r.Master.dahWas, r.Master.presWas = r.Master.DeleteAtHeight, r.Master.PreserveUntil
				rec = &r
			}
		}
		b.masters[string(txid)] = rec
	}
	oc := b.s.b(bucketUTXOOuts).Cursor()
	for _, k := range sortUnique(outs) {
		if _, ok := b.outs[string(k)]; ok {
			continue
		}
		var o *utxoOutput
		if kk, v := oc.Seek(k); kk != nil && bytes.Equal(kk, k) {
			o = &utxoOutput{}
			must(decodeOut(v, o))
		}
		b.outs[string(k)] = o
	}
}

func (s *applyState) applyBlock(c *UTXOBlockCmd) *Result {
	hash, ok := txidBytes(c.Hash)
	if !ok || !validHash(c.Prev) || c.Chunks < 0 || c.Chunks > 1<<16 || (c.Chunks > 0 && len(c.Txs) > 0) {
		return fail(errcode.MalformedCmd.With("bad block"))
	}
	tip := s.tipBlock()
	if tip != nil && c.Height <= tip.Height {
		if b := s.blockAt(c.Height); b != nil && b.Hash == c.Hash {
			s.dropStaged(c.Height)
			return &Result{UTXO: &UTXOResult{Block: &BlockResult{AlreadyApplied: true, Applied: b, Height: s.utxoHeight()}}}
		}
	}
	if tip != nil && (c.Prev != tip.Hash || c.Height != tip.Height+1) {
		e := errcode.BlockNotOnTip.With("block %d (prev %s) does not extend the tip %d (%s)", c.Height, c.Prev, tip.Height, tip.Hash)
		return fail(e)
	}
	txs := c.Txs
	if c.Chunks > 0 {
		for i := 0; i < c.Chunks; i++ {
			raw := s.b(bucketUTXOStage).Get(stageKey(c.Height, hash, i))
			if raw == nil {
				return fail(errcode.InvalidUTXOBlock.With("chunk %d of block %s was not staged", i, c.Hash))
			}
			more, ok := decodeBlockTxs(raw)
			if !ok {
				return fail(errcode.InvalidUTXOBlock.With("chunk %d of block %s is unreadable", i, c.Hash))
			}
			txs = append(txs, more...)
		}
	}
	id := uint32(u64(s.b(bucketMeta).Get(metaUTXOBlockSeq))) + 1
	p := s.planBlock(txs, c.Height, id)
	if len(p.fails) > 0 {
		e := errcode.BlockRejected.With("%d inputs or transactions of block %d failed; nothing was applied", len(p.fails), c.Height)
		e.Spends = p.fails
		return fail(e)
	}
	// Everything checked: write.
	s.setUTXOPolicy(c.Retention, c.Window)
	s.put(bucketMeta, metaUTXOBlockSeq, putU64(uint64(id)))
	s.put(bucketMeta, metaUTXOHeight, putU64(uint64(c.Height)))
	st := s.utxoStats()
	for _, r := range p.records {
		s.putUTXORecord(r.txid, r.idx, r.rec)
		st.Records++
		st.Outputs += int64(r.outputs)
	}
	for _, txid := range p.unfinished {
		s.finishMined(txid, p.b.masters[string(txid)])
	}
	p.b.flush()
	st.Txs += int64(len(p.created))
	st.Records += int64(len(p.created))
	for _, txid := range p.created {
		st.Outputs += int64(p.b.masters[string(txid)].Master.Total)
	}
	st.BlocksApplied++
	info := &BlockInfo{Height: c.Height, Hash: c.Hash, Prev: c.Prev, ID: id, Txs: len(txs), Created: len(p.created),
		Mined: len(p.mined), Spent: len(p.spent), At: s.now}
	s.putJSON(bucketUTXOBlocks, u32Key(c.Height), info)
	s.put(bucketUTXOUndo, u32Key(c.Height), encodeUndo(p))
	s.dropStaged(c.Height)
	return &Result{UTXO: &UTXOResult{Block: &BlockResult{Applied: info, Height: c.Height}, Height: c.Height}}
}

// dropStaged deletes staged chunks of blocks at or below height.
func (s *applyState) dropStaged(height uint32) {
	var keys [][]byte
	c := s.b(bucketUTXOStage).Cursor()
	for k, _ := c.First(); k != nil && binary.BigEndian.Uint32(k) <= height; k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	for _, k := range keys {
		s.del(bucketUTXOStage, k)
	}
}

// The undo delta: counts, then created txids, mined txids, spent outpoints
// and the spender (txid|vin) of each spent outpoint. Deltas written before
// the spenders were kept end with the outpoints.
func encodeUndo(p *blockPlan) []byte {
	b := make([]byte, 0, 12+32*(len(p.created)+len(p.mined))+72*len(p.spent))
	b = binary.BigEndian.AppendUint32(b, uint32(len(p.created)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(p.mined)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(p.spent)))
	for _, t := range p.created {
		b = append(b, t...)
	}
	for _, t := range p.mined {
		b = append(b, t...)
	}
	for _, o := range p.spent {
		b = append(b, o...)
	}
	for _, o := range p.spenders {
		b = append(b, o...)
	}
	return b
}

// undoDelta is a decoded delta; spenders is nil in one written before the
// spenders were kept.
type undoDelta struct{ created, mined, spent, spenders [][]byte }

func decodeUndo(b []byte) (*undoDelta, bool) {
	if len(b) < 12 {
		return nil, false
	}
	nc, nm, ns := uint64(binary.BigEndian.Uint32(b)), uint64(binary.BigEndian.Uint32(b[4:])), uint64(binary.BigEndian.Uint32(b[8:]))
	b = b[12:]
	withSpenders := uint64(len(b)) == 32*(nc+nm)+72*ns
	if !withSpenders && uint64(len(b)) != 32*(nc+nm)+36*ns {
		return nil, false
	}
	d := &undoDelta{}
	take := func(n uint64, size int) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			out[i], b = b[:size:size], b[size:]
		}
		return out
	}
	d.created, d.mined, d.spent = take(nc, 32), take(nm, 32), take(ns, 36)
	if withSpenders {
		d.spenders = take(ns, 36)
	}
	return d, true
}

func (s *applyState) rollbackBlocks(c *UTXOBlockCmd) *Result {
	tip := s.tipBlock()
	res := &BlockResult{}
	if tip == nil || c.Height >= tip.Height {
		res.Height = s.utxoHeight()
		return &Result{UTXO: &UTXOResult{Block: res, Height: res.Height}}
	}
	// Every delta must be there before anything is undone.
	deltas := map[uint32]*undoDelta{}
	for h := tip.Height; h > c.Height; h-- {
		d, ok := decodeUndo(s.b(bucketUTXOUndo).Get(u32Key(h)))
		if !ok || s.blockAt(h) == nil {
			e := errcode.BlockRollbackWindow.With("block %d is not kept any more (the oldest height a rollback reaches is %d)", h, h)
			return fail(e)
		}
		deltas[h] = d
	}
	for h := tip.Height; h > c.Height; h-- {
		info := s.blockAt(h)
		s.undoBlock(info, deltas[h], c.Height)
		s.del(bucketUTXOBlocks, u32Key(h))
		s.del(bucketUTXOUndo, u32Key(h))
		res.Undone = append(res.Undone, *info)
		s.utxoStats().BlocksUndone++
	}
	s.put(bucketMeta, metaUTXOHeight, putU64(uint64(c.Height)))
	res.Height = c.Height
	return &Result{UTXO: &UTXOResult{Block: res, Height: c.Height}}
}

// undoBlock undoes one block from its delta; transactions left without a
// block become unmined since the target height.
//
// An output is unspent only while the block's transaction still spends it:
// one unspent and spent by another transaction since keeps that spend.
func (s *applyState) undoBlock(info *BlockInfo, d *undoDelta, to uint32) {
	b := newUTXOBatch(s)
	var blockTxs map[string]bool // for a delta without spenders
	if d.spenders == nil {
		blockTxs = make(map[string]bool, len(d.created)+len(d.mined))
		for _, t := range slices.Concat(d.created, d.mined) {
			blockTxs[hex.EncodeToString(t)] = true
		}
	}
	for i := len(d.spent) - 1; i >= 0; i-- {
		k := d.spent[i]
		txid, vout := k[:32], binary.BigEndian.Uint32(k[32:])
		m, o := b.master(txid), b.out(txid, vout)
		if m == nil || o == nil || !o.Spent {
			continue
		}
		if d.spenders != nil {
			sp := d.spenders[i]
			if o.Spender != hex.EncodeToString(sp[:32]) || o.Vin != binary.BigEndian.Uint32(sp[32:]) {
				continue
			}
		} else if !blockTxs[o.Spender] {
			continue
		}
		o.Spent, o.Spender, o.Vin = false, "", 0
		m.Master.Spent--
		b.touchOut(txid, vout)
		b.touchMaster(txid)
	}
	for _, txid := range d.mined {
		rec := b.master(txid)
		if rec == nil {
			continue
		}
		m := rec.Master
		if i := m.blockIndex(info.ID, info.Height, s.rules() >= formatV9); i >= 0 {
			m.BlockIDs = slices.Delete(m.BlockIDs, i, i+1)
			m.BlockHeights = slices.Delete(m.BlockHeights, i, i+1)
			m.SubtreeIdxs = slices.Delete(m.SubtreeIdxs, i, i+1)
		}
		if len(m.BlockIDs) == 0 {
			u := to
			m.UnminedSince = &u
		}
		b.touchMaster(txid)
	}
	// The block's own transactions go; nothing of them may be written back.
	created := make(map[string]bool, len(d.created))
	for _, txid := range d.created {
		created[string(txid)] = true
		delete(b.masters, string(txid))
	}
	b.dirtyM = slices.DeleteFunc(b.dirtyM, func(k string) bool { return created[k] })
	b.dirtyO = slices.DeleteFunc(b.dirtyO, func(k string) bool { return created[k[:32]] })
	b.flush()
	for i := len(d.created) - 1; i >= 0; i-- {
		s.dropUTXOTx(d.created[i])
	}
}

// blockIndex is the index in m's block lists of the block id at height
// (by id alone with byHeight false, as builds before format 9 match: ids
// of applied blocks and of /v1/utxo/mined marks then collide); -1 when m
// is not marked mined in it.
func (m *UTXOMaster) blockIndex(id, height uint32, byHeight bool) int {
	for i, b := range m.BlockIDs {
		if b == id && (!byHeight || i < len(m.BlockHeights) && m.BlockHeights[i] == height) {
			return i
		}
	}
	return -1
}

// inBlock reports whether m is marked mined in block id at height.
func (m *UTXOMaster) inBlock(id, height uint32, byHeight bool) bool {
	return m.blockIndex(id, height, byHeight) >= 0
}

// freeDeltas deletes up to limit undo deltas of blocks that fell out of
// the rollback window, and the records of those blocks. With keepTip the
// record of the highest of them stays: a rollback may reach that block,
// and it is then the tip the next block must extend.
func (s *applyState) freeDeltas(limit int, keepTip bool) int {
	cutoff, ok := s.deltaCutoff()
	if !ok {
		return 0
	}
	undo := s.heightsUpTo(bucketUTXOUndo, cutoff, limit)
	for _, k := range undo {
		s.del(bucketUTXOUndo, k)
	}
	if keepTip {
		if s.rules() >= formatV9 {
			// A pass that freed only some of the deltas out of the window
			// keeps the record of the block below the lowest one left: a
			// rollback may reach that block.
			if k, _ := s.b(bucketUTXOUndo).Cursor().First(); k != nil {
				if lowest := binary.BigEndian.Uint32(k); lowest <= cutoff {
					if lowest == 0 {
						return len(undo)
					}
					cutoff = lowest - 1 // the block a rollback reaches
				}
			}
		}
		if cutoff == 0 {
			return len(undo)
		}
		cutoff--
	}
	for _, k := range s.heightsUpTo(bucketUTXOBlocks, cutoff, limit) {
		s.del(bucketUTXOBlocks, k)
	}
	return len(undo)
}

// deltaCutoff is the highest height whose undo delta is out of the
// rollback window; ok is false when no delta is.
func (r reader) deltaCutoff() (uint32, bool) {
	tip := r.tipBlock()
	window := max(r.utxoWindow(), r.utxoRetention())
	if tip == nil || tip.Height <= window {
		return 0, false
	}
	return tip.Height - window, true
}

// heightsUpTo returns up to limit keys of a height-keyed bucket, lowest
// first, whose height is at most h.
func (r reader) heightsUpTo(bucket []byte, h uint32, limit int) [][]byte {
	var keys [][]byte
	c := r.b(bucket).Cursor()
	for k, _ := c.First(); k != nil && len(keys) < limit && binary.BigEndian.Uint32(k) <= h; k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	return keys
}
