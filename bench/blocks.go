package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/internal/chaingen"
	"github.com/raftlockd/raftlockd/wire"
)

// The blocks benchmark: one chain of blocks of two-input, two-output
// transactions applied in order (a chain has one tip, so applies are
// sequential), a few blocks rolled back and applied again, and the
// leader's pruner deleting spent transactions as the chain grows.

// BlockRun is a size of block and how many of them to apply.
type BlockRun struct {
	Txs    int
	Blocks int
}

// ParseBlockRuns parses "1000x100,10000x10".
func ParseBlockRuns(s string) ([]BlockRun, error) {
	var out []BlockRun
	for _, part := range strings.Split(s, ",") {
		txs, blocks, ok := strings.Cut(strings.TrimSpace(part), "x")
		t, err1 := strconv.Atoi(txs)
		b, err2 := strconv.Atoi(blocks)
		if !ok || err1 != nil || err2 != nil || t < 1 || b < 1 {
			return nil, fmt.Errorf("%q: want TXSxBLOCKS, e.g. 1000x100", part)
		}
		out = append(out, BlockRun{Txs: t, Blocks: b})
	}
	return out, nil
}

// BlockResult is what one size of block measured.
type BlockResult struct {
	Txs          int           `json:"txs_per_block"`
	Blocks       int           `json:"blocks"`
	Elapsed      time.Duration `json:"elapsed_ns"`
	BlocksPerSec float64       `json:"blocks_per_sec"`
	SpendsPerSec float64       `json:"spends_per_sec"`
	P50          time.Duration `json:"p50_ns"`
	P99          time.Duration `json:"p99_ns"`
	// RollbackPerBlock is the mean time to roll back one block (one
	// rollback request per block).
	RollbackPerBlock time.Duration `json:"rollback_per_block_ns"`
	RolledBack       int           `json:"rolled_back"`
	// Pruned counts transactions the pruner deleted while the blocks were
	// applied, and PrunedPerSec their rate over the same time.
	Pruned       int64   `json:"pruned"`
	PrunedPerSec float64 `json:"pruned_per_sec"`
}

// RunBlocks applies the runs in order on one chain through c, starting at
// the server's tip (which must be empty: height 0).
func RunBlocks(ctx context.Context, c *client.Client, runs []BlockRun, rollback int) ([]BlockResult, error) {
	gen := chaingen.New(fmt.Sprintf("bench-%d", time.Now().UnixNano()))
	most := 0
	for _, r := range runs {
		most = max(most, r.Txs)
	}
	// Funding: enough unspent outputs for the largest block; afterwards
	// every block spends as many outputs as it creates.
	for gen.Unspent() < 2*most {
		if _, err := c.UTXOApplyBlock(ctx, gen.Fund(min(2*most-gen.Unspent(), 20000), 2)); err != nil {
			return nil, fmt.Errorf("funding block: %w", err)
		}
	}
	var out []BlockResult
	for _, r := range runs {
		st0, err := c.UTXOStatus(ctx, false)
		if err != nil {
			return nil, err
		}
		var lat []time.Duration
		var last []wire.UTXOBlockRequest // the blocks to roll back
		start := time.Now()
		for i := 0; i < r.Blocks; i++ {
			b := gen.Block(r.Txs, 2, 2)
			t := time.Now()
			if _, err := c.UTXOApplyBlock(ctx, b); err != nil {
				return nil, fmt.Errorf("block %d: %w", b.Height, err)
			}
			lat = append(lat, time.Since(t))
			if last = append(last, b); len(last) > rollback {
				last = last[1:]
			}
		}
		elapsed := time.Since(start)
		st1, err := c.UTXOStatus(ctx, false)
		if err != nil {
			return nil, err
		}
		res := BlockResult{Txs: r.Txs, Blocks: r.Blocks, Elapsed: elapsed,
			BlocksPerSec: float64(r.Blocks) / elapsed.Seconds(),
			SpendsPerSec: float64(2*r.Txs*r.Blocks) / elapsed.Seconds(),
			Pruned:       st1.Pruned - st0.Pruned}
		res.PrunedPerSec = float64(res.Pruned) / elapsed.Seconds()
		var sum Result
		sum.summarize(lat)
		res.P50, res.P99 = sum.P50, sum.P99
		// Roll the last blocks back one at a time, then apply them again
		// so that the chain goes on from the same tip.
		if len(last) > 0 {
			t := time.Now()
			for i := len(last) - 1; i >= 0; i-- {
				if _, err := c.UTXORollback(ctx, last[i].Height-1); err != nil {
					return nil, fmt.Errorf("rollback below %d: %w", last[i].Height, err)
				}
			}
			res.RolledBack = len(last)
			res.RollbackPerBlock = time.Since(t) / time.Duration(len(last))
			for _, b := range last {
				if _, err := c.UTXOApplyBlock(ctx, b); err != nil {
					return nil, fmt.Errorf("re-apply %d: %w", b.Height, err)
				}
			}
		}
		out = append(out, res)
	}
	return out, nil
}

// WriteBlockTable prints block results as a table.
func WriteBlockTable(w io.Writer, results []BlockResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "txs/block\tblocks\tblocks/s\tspends/s\tp50\tp99\trollback/block\tpruned\tpruned/s\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%d\t%d\t%.1f\t%.0f\t%s\t%s\t%s\t%d\t%.0f\t\n", r.Txs, r.Blocks, r.BlocksPerSec, r.SpendsPerSec,
			ms(r.P50), ms(r.P99), ms(r.RollbackPerBlock), r.Pruned, r.PrunedPerSec)
	}
	return tw.Flush()
}
