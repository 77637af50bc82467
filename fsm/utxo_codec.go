package fsm

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
)

// Outputs are the most numerous UTXO values, read and written by every
// spend and block, so they are stored in a compact binary form rather than
// JSON:
//
//	version(1)=2 flags(1) hash(32) satoshis(8)
//	[spent]   spender(32) vin(4)
//	[sah]     spendable_at_height(4)
//	[rsv]     txn length(2) txn spender(32) vin(4)
//
// A value starting with '{' is the JSON form of earlier versions.

const outFormat = 2

const (
	outSpent = 1 << iota
	outFrozen
	outSAH
	outRsv
)

var errBadOutput = errors.New("fsm: malformed utxo output")

func appendHex32(b []byte, s string) []byte {
	var x [32]byte
	_, _ = hex.Decode(x[:], []byte(s))
	return append(b, x[:]...)
}

func encodeOut(o *utxoOutput) []byte {
	flags := byte(0)
	n := 2 + 32 + 8
	if o.Spent {
		flags |= outSpent
		n += 36
	}
	if o.Frozen {
		flags |= outFrozen
	}
	if o.SpendableAt != 0 {
		flags |= outSAH
		n += 4
	}
	if o.Rsv != nil {
		flags |= outRsv
		n += 2 + len(o.Rsv.Txn) + 36
	}
	b := make([]byte, 0, n)
	b = append(b, outFormat, flags)
	b = appendHex32(b, o.Hash)
	b = binary.BigEndian.AppendUint64(b, o.Sats)
	if o.Spent {
		b = appendHex32(b, o.Spender)
		b = binary.BigEndian.AppendUint32(b, o.Vin)
	}
	if o.SpendableAt != 0 {
		b = binary.BigEndian.AppendUint32(b, o.SpendableAt)
	}
	if o.Rsv != nil {
		b = binary.BigEndian.AppendUint16(b, uint16(len(o.Rsv.Txn)))
		b = append(b, o.Rsv.Txn...)
		b = appendHex32(b, o.Rsv.Spender)
		b = binary.BigEndian.AppendUint32(b, o.Rsv.Vin)
	}
	return b
}

func decodeOut(b []byte, o *utxoOutput) error {
	if len(b) > 0 && b[0] == '{' {
		return json.Unmarshal(b, o)
	}
	if len(b) < 42 || b[0] != outFormat {
		return errBadOutput
	}
	flags := b[1]
	*o = utxoOutput{Hash: hex.EncodeToString(b[2:34]), Sats: binary.BigEndian.Uint64(b[34:42]), Frozen: flags&outFrozen != 0}
	b = b[42:]
	if flags&outSpent != 0 {
		if len(b) < 36 {
			return errBadOutput
		}
		o.Spent, o.Spender, o.Vin = true, hex.EncodeToString(b[:32]), binary.BigEndian.Uint32(b[32:36])
		b = b[36:]
	}
	if flags&outSAH != 0 {
		if len(b) < 4 {
			return errBadOutput
		}
		o.SpendableAt, b = binary.BigEndian.Uint32(b), b[4:]
	}
	if flags&outRsv != 0 {
		if len(b) < 2 {
			return errBadOutput
		}
		n := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+n+36 {
			return errBadOutput
		}
		o.Rsv = &utxoReserve{Txn: string(b[2 : 2+n]), Spender: hex.EncodeToString(b[2+n : 2+n+32]),
			Vin: binary.BigEndian.Uint32(b[2+n+32:])}
		b = b[2+n+36:]
	}
	if len(b) != 0 {
		return errBadOutput
	}
	return nil
}

func (s *applyState) putOut(key []byte, o *utxoOutput) { s.put(bucketUTXOOuts, key, encodeOut(o)) }

// Records (masters above all, read and written by every spend of their
// outputs) are binary too:
//
//	version(1)=2 flags(1) first(4) count(4)
//	[master] records(4) vouts(4) total(4) spent(4) mflags(1) height(4)
//	         unmined_since(4) dah(4) preserve_until(4) created_at(8)
//	         blocks(4) {id(4) height(4) subtree(4)}...
//	         deleted(4) {txid(32)}...  inputs(4) {txid(32) vout(4)}...
//	         staged_by length(2) staged_by

const (
	recCreating = 1 << iota
	recMaster
)

const (
	mCoinbase = 1 << iota
	mConflicting
	mLocked
	mUnmined
)

func encodeRecord(r *UTXORecord) []byte {
	flags := byte(0)
	if r.Creating {
		flags |= recCreating
	}
	m := r.Master
	if m != nil {
		flags |= recMaster
	}
	b := make([]byte, 0, 64)
	b = append(b, outFormat, flags)
	b = binary.BigEndian.AppendUint32(b, r.First)
	b = binary.BigEndian.AppendUint32(b, r.Count)
	if m == nil {
		return b
	}
	mf := byte(0)
	for _, f := range []struct {
		bit byte
		on  bool
	}{{mCoinbase, m.Coinbase}, {mConflicting, m.Conflicting}, {mLocked, m.Locked}, {mUnmined, m.UnminedSince != nil}} {
		if f.on {
			mf |= f.bit
		}
	}
	unmined := uint32(0)
	if m.UnminedSince != nil {
		unmined = *m.UnminedSince
	}
	for _, v := range []uint32{uint32(m.Records), m.Vouts, uint32(m.Total), uint32(m.Spent)} {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	b = append(b, mf)
	for _, v := range []uint32{m.Height, unmined, m.DeleteAtHeight, m.PreserveUntil} {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(m.CreatedAt))
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.BlockIDs)))
	for i := range m.BlockIDs {
		b = binary.BigEndian.AppendUint32(b, m.BlockIDs[i])
		b = binary.BigEndian.AppendUint32(b, m.BlockHeights[i])
		b = binary.BigEndian.AppendUint32(b, uint32(m.SubtreeIdxs[i]))
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.DeletedChildren)))
	for _, c := range m.DeletedChildren {
		b = appendHex32(b, c)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.Inputs)))
	for _, in := range m.Inputs {
		b = appendHex32(b, in.TxID)
		b = binary.BigEndian.AppendUint32(b, in.Vout)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.StagedBy)))
	return append(b, m.StagedBy...)
}

// recReader reads a binary record, remembering the first shortfall.
type recReader struct {
	b   []byte
	bad bool
}

func (r *recReader) take(n int) []byte {
	if r.bad || len(r.b) < n {
		r.bad = true
		return make([]byte, n)
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *recReader) u32() uint32 { return binary.BigEndian.Uint32(r.take(4)) }

// count reads a list length and checks that size bytes per item remain.
func (r *recReader) count(size int) int {
	n := int(r.u32())
	if r.bad || n > len(r.b)/size {
		r.bad = true
		return 0
	}
	return n
}

func decodeRecord(b []byte, rec *UTXORecord) error {
	if len(b) > 0 && b[0] == '{' {
		return json.Unmarshal(b, rec)
	}
	if len(b) < 10 || b[0] != outFormat {
		return errBadOutput
	}
	r := &recReader{b: b[2:]}
	flags := b[1]
	*rec = UTXORecord{First: r.u32(), Count: r.u32(), Creating: flags&recCreating != 0}
	if flags&recMaster != 0 {
		m := &UTXOMaster{Records: int(r.u32()), Vouts: r.u32(), Total: int(r.u32()), Spent: int(r.u32())}
		mf := r.take(1)[0]
		m.Coinbase, m.Conflicting, m.Locked = mf&mCoinbase != 0, mf&mConflicting != 0, mf&mLocked != 0
		m.Height = r.u32()
		if unmined := r.u32(); mf&mUnmined != 0 {
			m.UnminedSince = &unmined
		}
		m.DeleteAtHeight, m.PreserveUntil = r.u32(), r.u32()
		m.CreatedAt = int64(binary.BigEndian.Uint64(r.take(8)))
		n := r.count(12)
		m.BlockIDs, m.BlockHeights, m.SubtreeIdxs = make([]uint32, n), make([]uint32, n), make([]int32, n)
		for i := 0; i < n; i++ {
			m.BlockIDs[i], m.BlockHeights[i], m.SubtreeIdxs[i] = r.u32(), r.u32(), int32(r.u32())
		}
		if n = r.count(32); n > 0 {
			m.DeletedChildren = make([]string, n)
			for i := range m.DeletedChildren {
				m.DeletedChildren[i] = hex.EncodeToString(r.take(32))
			}
		}
		if n = r.count(36); n > 0 {
			m.Inputs = make([]UTXOPoint, n)
			for i := range m.Inputs {
				m.Inputs[i] = UTXOPoint{TxID: hex.EncodeToString(r.take(32)), Vout: r.u32()}
			}
		}
		m.StagedBy = string(r.take(int(binary.BigEndian.Uint16(r.take(2)))))
		rec.Master = m
	}
	if r.bad || len(r.b) != 0 {
		return errBadOutput
	}
	return nil
}
