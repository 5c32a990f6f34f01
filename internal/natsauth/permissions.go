package natsauth

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/stepsign"
)

// Permissions are a NATS user's publish and subscribe allow lists; what is
// not listed is denied.
type Permissions struct {
	// Publish subjects (wildcards allowed).
	Publish []string
	// Subscribe subjects.
	Subscribe []string
	// Responses lets the user answer requests sent to it (one reply per
	// request, within a minute) without publish rights on _INBOX.>.
	Responses bool
}

// Server is p as an embedded nats-server's user permissions.
func (p Permissions) Server() *server.Permissions {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.Publish},
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe},
	}
	if p.Responses {
		sp.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	}
	return sp
}

// planCacheBucket is the planner's KV bucket (services/planner, which
// internal/ may not import).
const planCacheBucket = "planex-plans"

// resources are the streams every service may create when missing (and
// look up) at start: bus.Setup is idempotent and run by every service.
var resources = []string{
	bus.StreamEvents, bus.StreamSteps, bus.StreamEngine,
	"KV_" + bus.BucketRuns, "KV_" + bus.BucketTools, "KV_" + bus.BucketEffects,
	"KV_" + bus.BucketIdempotency, "KV_" + bus.BucketDrafts, "OBJ_" + bus.ObjectOutputs,
}

func setup() []string {
	out := []string{"$JS.API.INFO"}
	for _, s := range resources {
		out = append(out, "$JS.API.STREAM.CREATE."+s, "$JS.API.STREAM.INFO."+s)
	}
	return out
}

// kvReadWrite lets a user get, put and delete keys of a bucket (no
// watching, no listing of other buckets).
func kvReadWrite(bucket string) []string {
	return []string{"$KV." + bucket + ".>", "$JS.API.DIRECT.GET.KV_" + bucket + ".>", "$JS.API.DIRECT.GET.KV_" + bucket,
		"$JS.API.STREAM.MSG.GET.KV_" + bucket}
}

// Services lists the NATS identities planex uses: "supervisor", "planner"
// and "executor-<pool>" for each pool.
func Services(pools ...string) []string {
	out := []string{"supervisor", "planner"}
	for _, p := range pools {
		out = append(out, "executor-"+p)
	}
	return out
}

// ForService returns the least-privilege permissions of a planex service:
//
//   - supervisor: owns the JetStream resources and the run log: the whole
//     JetStream API, run logs, step requests, the engine inbox and timers,
//     every planex bucket and the output store.
//   - planner: may create the shared resources when missing, and its own
//     plan cache bucket; nothing of runs or steps.
//   - executor-<pool>: its own pool's durable consumer on PLANEX_STEPS
//     (fetch and ack), results and started notices on
//     planex.engine.*.{result,started}, its pool's replicas' attempt
//     queries (planex.executor.<pool>.*.attempts), the tool catalog and effect
//     records, drafts (email), the output store, and its pool's keys of
//     the shared step replay bucket (stepsign.ReplayBucket). It can neither
//     publish step requests (planex.steps.*) nor read run logs
//     (planex.events.*), other pools' steps or the engine inbox.
//
// Every service subscribes only to its own inboxes (bus.InboxPrefix, which
// bus.Connect sets) for replies: not to _INBOX.>, where it could read the
// other services' replies, JetStream API answers included.
func ForService(service string) (Permissions, error) {
	inbox := []string{bus.InboxPrefix(service) + ".>"}
	switch {
	case service == "supervisor":
		return Permissions{
			Publish: []string{"$JS.API.>", "$JS.ACK." + bus.StreamEngine + ".>", "$JS.FC.>",
				bus.SubjectEventsPrefix + ">", bus.SubjectStepsPrefix + ">", bus.SubjectEnginePrefix + ">", bus.SubjectTimersPrefix + ">",
				"$KV." + bus.BucketRuns + ".>", "$KV." + bus.BucketTools + ".>", "$KV." + bus.BucketEffects + ".>",
				"$KV." + bus.BucketIdempotency + ".>", "$KV." + bus.BucketDrafts + ".>", "$KV." + bus.BucketSupervisors + ".>",
				"$O." + bus.ObjectOutputs + ".>"},
			Subscribe: inbox,
		}, nil
	case service == "planner":
		pub := append(setup(), "$JS.API.STREAM.CREATE.KV_"+planCacheBucket, "$JS.API.STREAM.UPDATE.KV_"+planCacheBucket,
			"$JS.API.STREAM.INFO.KV_"+planCacheBucket)
		return Permissions{Publish: append(pub, kvReadWrite(planCacheBucket)...), Subscribe: inbox}, nil
	case strings.HasPrefix(service, "executor-"):
		pool := strings.TrimPrefix(service, "executor-")
		if !bus.ValidToken(pool) {
			return Permissions{}, fmt.Errorf("NATS permissions: pool %q: not a subject token", pool)
		}
		stream, cons := bus.StreamSteps, bus.PoolConsumer(pool)
		pub := append(setup(),
			"$JS.API.CONSUMER.CREATE."+stream+"."+cons, "$JS.API.CONSUMER.CREATE."+stream+"."+cons+".>",
			"$JS.API.CONSUMER.DURABLE.CREATE."+stream+"."+cons, "$JS.API.CONSUMER.INFO."+stream+"."+cons,
			"$JS.API.CONSUMER.MSG.NEXT."+stream+"."+cons, "$JS.ACK."+stream+"."+cons+".>",
			bus.SubjectEnginePrefix+"*."+bus.KindResult, bus.SubjectEnginePrefix+"*."+bus.KindStarted,
			"$O."+bus.ObjectOutputs+".>", "$JS.API.DIRECT.GET.OBJ_"+bus.ObjectOutputs+".>", "$JS.API.STREAM.MSG.GET.OBJ_"+bus.ObjectOutputs,
			"$JS.API.STREAM.PURGE.OBJ_"+bus.ObjectOutputs)
		// The pool's keys of the replay bucket its replicas share.
		replay := stepsign.ReplayBucket
		pub = append(pub, "$JS.API.STREAM.CREATE.KV_"+replay, "$JS.API.STREAM.INFO.KV_"+replay,
			"$KV."+replay+"."+pool+".>", "$JS.API.DIRECT.GET.KV_"+replay+".$KV."+replay+"."+pool+".>")
		// On NATS 2.11+ the pool takes its steps from the run logs: its
		// consumer on PLANEX_EVENTS, created only with its dispatch filter
		// (the filter is part of the create subject), so it reads the
		// decisions that dispatch its steps and its requests, not the logs.
		ev := bus.StreamEvents
		pub = append(pub,
			"$JS.API.CONSUMER.CREATE."+ev+"."+cons+"."+bus.DispatchFilter(pool), "$JS.API.CONSUMER.INFO."+ev+"."+cons,
			"$JS.API.CONSUMER.MSG.NEXT."+ev+"."+cons, "$JS.ACK."+ev+"."+cons+".>")
		pub = append(pub, kvReadWrite(bus.BucketTools)...)
		// Listing the pool's registrations (its replicas, for the pool
		// consumer's MaxAckPending) is a filtered watch: an ephemeral
		// ordered consumer on the pool's keys, its flow control and its
		// deletion.
		tools := "KV_" + bus.BucketTools
		pub = append(pub, "$JS.API.CONSUMER.CREATE."+tools+".*.$KV."+bus.BucketTools+"."+pool+".>",
			"$JS.API.CONSUMER.DELETE."+tools+".*", "$JS.FC."+tools+".>")
		pub = append(pub, kvReadWrite(bus.BucketEffects)...)
		if pool == "email" {
			pub = append(pub, kvReadWrite(bus.BucketDrafts)...)
		}
		// Replicas of the pool ask each other whether one still runs an
		// attempt (runner.AttemptsSubject).
		attempts := "planex.executor." + pool + ".*.attempts"
		return Permissions{Publish: append(pub, attempts), Subscribe: append(inbox, attempts), Responses: true}, nil
	}
	return Permissions{}, fmt.Errorf("NATS permissions: unknown service %q: want supervisor, planner or executor-<pool>", service)
}

// ServerConfig renders the authorization block of a nats-server
// configuration file with one nkey user per service (nkeys maps service
// to its public nkey) — what deploy/k8s's nats.conf carries.
func ServerConfig(nkeys map[string]string) (string, error) {
	var b strings.Builder
	b.WriteString("authorization {\n  users = [\n")
	names := make([]string, 0, len(nkeys))
	for n := range nkeys {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		p, err := ForService(n)
		if err != nil {
			return "", err
		}
		responses := ""
		if p.Responses {
			responses = "        allow_responses: { max: 1, expires: \"1m\" }\n"
		}
		fmt.Fprintf(&b, "    # %s\n    {\n      nkey: %q\n      permissions: {\n        publish: { allow: %s }\n        subscribe: { allow: %s }\n%s      }\n    }\n",
			n, nkeys[n], quoteList(p.Publish), quoteList(p.Subscribe), responses)
	}
	b.WriteString("  ]\n}\n")
	return b.String(), nil
}

func quoteList(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
