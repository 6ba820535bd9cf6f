package dispatch

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/effect/sqlscript"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
)

// BenchmarkSQLEffect measures Drain over b.N pre-recorded completions with
// the --sql effect (the transactional inbox's ledger + outbox script: three statements in
// the transaction that marks the key done), on SQLite and on PostgreSQL
// (skipped without GEMRECON_TEST_POSTGRES), next to the print effect on the
// same backend, with the raw append+fdatasync rate of the local disk
// measured right after each run. Run with a fixed N, e.g.
//
//	go test -run '^$' -bench BenchmarkSQLEffect -benchtime 2000x ./dispatch
func BenchmarkSQLEffect(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres"} {
		for _, eff := range []string{"sql", "print"} {
			for _, conc := range []int{1, 4, 16} {
				b.Run(fmt.Sprintf("%s/effect=%s/concurrency=%d", backend, eff, conc), func(b *testing.B) {
					benchSQLEffect(b, backend == "postgres", eff == "sql", conc)
				})
			}
		}
	}
}

func benchSQLEffect(b *testing.B, pg, useSQL bool, conc int) {
	ctx := context.Background()
	w := newSQLWorld(b, pg)
	s, err := dial.Open(ctx, w.db, sink.Options{BusyTimeout: 30 * time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	w.exec(b, w.pick(sqliteSchema, postgresSchema))
	tx, err := w.app.Begin()
	if err != nil {
		b.Fatal(err)
	}
	for i := range b.N {
		_, name, _ := invoiceKey(i)
		if _, err := tx.Exec(fmt.Sprintf(`INSERT INTO invoices (id, amount_due) VALUES ('%s', 1000)`, name)); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < b.N; i += 16 {
				key, _, payload := invoiceKey(i)
				if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: payload}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		return
	}
	cfg := Config{Sink: s, Concurrency: conc, Logger: quietLogger()}
	if useSQL {
		path := filepath.Join(w.dir, "effect.sql")
		if err := os.WriteFile(path, []byte(w.pick(sqliteLedgerScript, postgresLedgerScript)), 0o600); err != nil {
			b.Fatal(err)
		}
		if cfg.SQL, err = sqlscript.Load(path); err != nil {
			b.Fatal(err)
		}
	} else {
		cfg.Effect = effect.NewPrint(io.Discard, nil)
	}
	d, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	sum, err := d.Drain(ctx)
	elapsed := time.Since(start)
	b.StopTimer()
	if err != nil || sum.OK != b.N {
		b.Fatalf("Drain() = %+v, %v, want %d done", sum, err, b.N)
	}
	if useSQL {
		if got := w.count(b, `SELECT count(*) FROM ledger_entries`); got != int64(b.N) {
			b.Fatalf("ledger rows = %d, want %d", got, b.N)
		}
	}
	perSec := float64(sum.OK) / elapsed.Seconds()
	raw := rawSyncRate(b, w.dir, 1000)
	b.ReportMetric(perSec, "completions/s")
	b.ReportMetric(raw, "rawsyncs/s")
	b.ReportMetric(perSec/raw, "completions/sync")
}
