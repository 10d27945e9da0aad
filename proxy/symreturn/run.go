package symreturn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
)

// DefaultPeriod is how often Run compares the interfaces' tables with the main table's routes
// (a DHCP lease on the second NIC may change its default route) and puts back what is missing.
const DefaultPeriod = 10 * time.Second

// KernelIO is the kernel boundary of Sync (Kernel in production, a recording fake in tests).
type KernelIO interface {
	ApplyTable(Plan) error
	Links() (map[string]int, error)
	MainRoutes() ([]Route, error)
	OwnRoutes() ([]Route, error)
	AddRoute(Route) error
	DelRoute(Route) error
	OwnRules() ([]Rule, error)
	AddRule(Rule) error
	DelRule(Rule) error
}

// SyncRoutes makes vipgate's ip rules and routes those of p: what carries RouteProtocol and p
// does not want goes (so an empty plan removes everything), what p wants and is missing comes.
// Routes come before the rules that select their tables and go after them.
func SyncRoutes(k KernelIO, p Plan) (changes int, err error) {
	links, err := k.Links()
	if err != nil {
		return 0, err
	}
	var main []Route
	if p.Enabled() {
		if main, err = k.MainRoutes(); err != nil {
			return 0, err
		}
	}
	haveRoutes, err := k.OwnRoutes()
	if err != nil {
		return 0, err
	}
	haveRules, err := k.OwnRules()
	if err != nil {
		return 0, err
	}
	addRoutes, delRoutes := Diff(p.Routes(links, main), haveRoutes)
	addRules, delRules := Diff(p.Rules(), haveRules)
	var errs []error
	for _, r := range delRules {
		errs = append(errs, wrap("deleting "+r.String(), k.DelRule(r)))
	}
	for _, r := range delRoutes {
		errs = append(errs, wrap("deleting route "+r.String(), k.DelRoute(r)))
	}
	for _, r := range addRoutes {
		errs = append(errs, wrap("adding route "+r.String(), k.AddRoute(r)))
	}
	for _, r := range addRules {
		errs = append(errs, wrap("adding "+r.String(), k.AddRule(r)))
	}
	return len(delRules) + len(delRoutes) + len(addRoutes) + len(addRules), errors.Join(errs...)
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Apply programs p once: the table, then the rules and routes. An empty plan removes what an
// earlier config left (`vipgate node` with the option turned off, and --cleanup).
func Apply(k KernelIO, p Plan) error {
	if err := k.ApplyTable(p); err != nil {
		return err
	}
	_, err := SyncRoutes(k, p)
	return err
}

// Run applies p, then keeps the rules and routes in step with the main table every period until
// ctx ends. It leaves everything in place when it returns, as the node leaves its table: replies
// keep their path while vipgate restarts.
func Run(ctx context.Context, log hclog.Logger, k KernelIO, p Plan, period time.Duration) {
	tableDone := false
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		if !tableDone {
			if err := k.ApplyTable(p); err != nil {
				log.Error("symmetric return: programming the table", "table", p.Table, "err", err)
			} else {
				tableDone = true
				if p.Enabled() {
					log.Info("symmetric return: table programmed", "table", p.Table, "interfaces", len(p.Interfaces))
				}
			}
		}
		if n, err := SyncRoutes(k, p); err != nil {
			log.Error("symmetric return: syncing rules and routes", "err", err)
		} else if n > 0 {
			log.Info("symmetric return: rules and routes synced", "changes", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
