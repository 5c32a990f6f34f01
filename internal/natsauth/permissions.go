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

// Identities a Grant applies to.
const (
	// Supervisor is the supervisor's identity.
	Supervisor = "supervisor"
	// Planner is the planner's identity.
	Planner = "planner"
	// Executor stands for every "executor-<pool>" identity in Table.
	Executor = "executor"
)

// poolVar stands for the executor's pool in a Grant's subjects.
const poolVar = "{pool}"

// Grant is one row of the permission table: what an identity may do with
// one planex resource, and the NATS subjects that allow exactly that.
type Grant struct {
	// Identity is Supervisor, Planner, Executor (every executor-<pool>) or
	// one pool's "executor-<pool>".
	Identity string
	// Resource names the stream, bucket or subjects concerned.
	Resource string
	// Access says what the identity may do there, and why.
	Access string
	// Publish are the subjects it may publish to (JetStream API calls
	// included); "{pool}" stands for the executor's pool.
	Publish []string
	// Subscribe are the subjects it may subscribe to.
	Subscribe []string
}

// streamSetup lets an identity create a stream when it is missing, as
// bus.Setup does from every replica, and look it up — never update,
// purge or delete it.
func streamSetup(streams ...string) []string {
	var out []string
	for _, s := range streams {
		out = append(out, "$JS.API.STREAM.CREATE."+s, "$JS.API.STREAM.INFO."+s)
	}
	return out
}

// directGet lets an identity read the last message of subjects of a
// stream (KV Get, object store look-ups), confined by the subject in the
// request's own subject. The request-body forms ($JS.API.DIRECT.GET.<stream>
// and $JS.API.STREAM.MSG.GET.<stream>), which name the subject in the
// body, NATS cannot confine: they are granted to no one but the supervisor.
func directGet(stream, subjects string) string {
	return "$JS.API.DIRECT.GET." + stream + "." + subjects
}

// consumer lets an executor create (only with the given filter, which
// NATS checks in the create subject), look up, fetch from and acknowledge
// its pool's durable consumer of stream.
func consumer(stream, filter string) []string {
	cons := bus.PoolConsumer(poolVar)
	return []string{
		"$JS.API.CONSUMER.CREATE." + stream + "." + cons + "." + filter,
		"$JS.API.CONSUMER.INFO." + stream + "." + cons,
		"$JS.API.CONSUMER.MSG.NEXT." + stream + "." + cons,
		"$JS.ACK." + stream + "." + cons + ".>",
	}
}

// table is the permission table: every identity's NATS permissions
// (ForService), the nats-server configuration (ServerConfig: the dev
// stack's embedded server and `planex auth k8s-secrets`/`nats-config`) and
// docs/security.md's table (Markdown) derive from it.
var table = []Grant{
	// The supervisor owns JetStream: it creates and updates every stream,
	// bucket and consumer, and reads every pool's outputs.
	{Identity: Supervisor, Resource: "JetStream API", Access: "everything: owns retention, consumers, every stream and bucket (reads every pool's output bucket)",
		Publish: []string{"$JS.API.>"}},
	{Identity: Supervisor, Resource: bus.StreamEngine + ", " + bus.StreamTimers, Access: "acknowledge engine messages and the timers NATS fires",
		Publish: []string{"$JS.ACK." + bus.StreamEngine + ".>", "$JS.ACK." + bus.StreamTimers + ".>"}},
	{Identity: Supervisor, Resource: "flow control", Access: "answer flow control of its consumers (catalog watch, output reads)",
		Publish: []string{"$JS.FC.>"}},
	{Identity: Supervisor, Resource: bus.StreamEvents + ", " + bus.StreamSteps + ", " + bus.StreamEngine + ", " + bus.StreamTimers, Access: "append run logs; publish step requests, engine messages, timers and the schedules of timers due later",
		Publish: []string{bus.SubjectEventsPrefix + ">", bus.SubjectStepsPrefix + ">", bus.SubjectEnginePrefix + ">", bus.SubjectTimersPrefix + ">", bus.SubjectLaterPrefix + ">"}},
	{Identity: Supervisor, Resource: "every planex KV bucket", Access: "read and write keys",
		Publish: []string{
			"$KV." + bus.BucketRuns + ".>", "$KV." + bus.BucketTools + ".>", "$KV." + bus.BucketEffects + ".>",
			"$KV." + bus.BucketIdempotency + ".>", "$KV." + bus.BucketDrafts + ".>", "$KV." + bus.BucketSupervisors + ".>",
			"$KV." + bus.BucketToolFloors + ".>", "$KV." + bus.BucketTenants + ".>", "$KV." + bus.BucketUsage + ".>",
		}},
	{Identity: Supervisor, Resource: "event triggers", Access: "publish fired and webhook events, record outcomes and rejections, store triggers, acknowledge events",
		Publish: []string{"planex.inbound.>", "planex.trigger-outcomes.>", "planex.trigger-rejections.>", "$KV.planex-triggers.>", "$JS.ACK.PLANEX_TRIGGER_EVENTS.>"}},
	{Identity: Supervisor, Resource: "bucket " + bus.BucketSchedules, Access: "store schedules and their firing state (compare-and-set)",
		Publish: []string{"$KV." + bus.BucketSchedules + ".>"}},
	{Identity: Supervisor, Resource: "object store " + bus.ObjectOutputs, Access: "store run results and outputs it moves out of the run log",
		Publish: []string{"$O." + bus.ObjectOutputs + ".>"}},
	{Identity: Supervisor, Resource: "object store " + bus.ObjectRunIndex, Access: "store and read the checkpoint of its run index",
		Publish: []string{"$O." + bus.ObjectRunIndex + ".>"}},

	// The planner plans: nothing of runs, steps, the catalog or outputs.
	{Identity: Planner, Resource: "JetStream API", Access: "account information (health)",
		Publish: []string{"$JS.API.INFO"}},
	{Identity: Planner, Resource: "KV " + planCacheBucket, Access: "create, update and look up its plan cache; read and write its keys",
		Publish: []string{
			"$JS.API.STREAM.CREATE.KV_" + planCacheBucket, "$JS.API.STREAM.UPDATE.KV_" + planCacheBucket, "$JS.API.STREAM.INFO.KV_" + planCacheBucket,
			"$KV." + planCacheBucket + ".>", directGet("KV_"+planCacheBucket, ">"),
		}},

	// An executor runs its pool's steps and keeps to its pool's keys.
	{Identity: Executor, Resource: "JetStream API", Access: "account information (health, bucket features)",
		Publish: []string{"$JS.API.INFO"}},
	{Identity: Executor, Resource: bus.StreamSteps + ", " + bus.StreamEvents + ", " + bus.StreamEngine, Access: "create when missing, look up",
		Publish: streamSetup(bus.StreamSteps, bus.StreamEvents, bus.StreamEngine)},
	{Identity: Executor, Resource: bus.StreamSteps, Access: "its pool's durable consumer, created only with the filter " + bus.PoolFilter(poolVar) + ": fetch, acknowledge",
		Publish: consumer(bus.StreamSteps, bus.PoolFilter(poolVar))},
	{Identity: Executor, Resource: bus.StreamEvents, Access: "its pool's durable consumer (NATS 2.11+), created only with the filter " + bus.DispatchFilter(poolVar) + ": the decisions dispatching its steps and its requests, never a run's log",
		Publish: consumer(bus.StreamEvents, bus.DispatchFilter(poolVar))},
	{Identity: Executor, Resource: bus.StreamEngine, Access: "publish step results and started notices",
		Publish: []string{bus.SubjectEnginePrefix + "*." + bus.KindResult, bus.SubjectEnginePrefix + "*." + bus.KindStarted}},
	{Identity: Executor, Resource: "KV " + bus.BucketTools, Access: "create when missing, look up; write and read its pool's registrations (<pool>.<verb>.<replica>); list them (a filtered ordered consumer, its flow control and deletion)",
		Publish: append(streamSetup("KV_"+bus.BucketTools),
			"$KV."+bus.BucketTools+"."+poolVar+".>", directGet("KV_"+bus.BucketTools, "$KV."+bus.BucketTools+"."+poolVar+".>"),
			"$JS.API.CONSUMER.CREATE.KV_"+bus.BucketTools+".*.$KV."+bus.BucketTools+"."+poolVar+".>",
			"$JS.API.CONSUMER.DELETE.KV_"+bus.BucketTools+".*", "$JS.FC.KV_"+bus.BucketTools+".>")},
	{Identity: Executor, Resource: "KV " + bus.BucketEffects, Access: "create when missing, look up; write and read its pool's effect records (<pool>.<run>.<step>.<attempt>); read records of the layout before pools (<run>.<step>.<attempt>), never write them",
		Publish: append(streamSetup("KV_"+bus.BucketEffects),
			"$KV."+bus.BucketEffects+"."+poolVar+".>", directGet("KV_"+bus.BucketEffects, "$KV."+bus.BucketEffects+"."+poolVar+".>"),
			directGet("KV_"+bus.BucketEffects, "$KV."+bus.BucketEffects+".*.*.*"))},
	{Identity: Executor, Resource: "KV " + stepsign.ReplayBucket, Access: "create when missing, look up; write and read its pool's accepted step signatures",
		Publish: append(streamSetup("KV_"+stepsign.ReplayBucket),
			"$KV."+stepsign.ReplayBucket+"."+poolVar+".>", directGet("KV_"+stepsign.ReplayBucket, "$KV."+stepsign.ReplayBucket+"."+poolVar+".>"))},
	{Identity: Executor, Resource: "object store " + bus.OutputBucket(poolVar), Access: "create when missing, look up; store its pool's large outputs and look up their names (never replace, purge or read another bucket)",
		Publish: append(streamSetup("OBJ_"+bus.OutputBucket(poolVar)),
			"$O."+bus.OutputBucket(poolVar)+".>", directGet("OBJ_"+bus.OutputBucket(poolVar), "$O."+bus.OutputBucket(poolVar)+".M.>"))},
	{Identity: Executor, Resource: "planex.executor." + poolVar + ".*.attempts", Access: "its pool's replicas ask each other whether an attempt still runs (and answer, allow_responses)",
		Publish: []string{"planex.executor." + poolVar + ".*.attempts"}, Subscribe: []string{"planex.executor." + poolVar + ".*.attempts"}},
	{Identity: "executor-" + bus.EmailPool, Resource: "KV " + bus.BucketDrafts, Access: "create when missing, look up; read and write drafts (no other pool has any access)",
		Publish: append(streamSetup("KV_"+bus.BucketDrafts), "$KV."+bus.BucketDrafts+".>", directGet("KV_"+bus.BucketDrafts, ">"))},
}

// Table returns the permission table's rows, in order. Identities'
// replies (bus.InboxPrefix) are not rows: every identity subscribes to
// its own inbox prefix, and to nothing else unless a row says so.
func Table() []Grant {
	out := make([]Grant, len(table))
	for i, g := range table {
		g.Publish, g.Subscribe = slices.Clone(g.Publish), slices.Clone(g.Subscribe)
		out[i] = g
	}
	return out
}

// Services lists the NATS identities planex uses: "supervisor", "planner"
// and "executor-<pool>" for each pool.
func Services(pools ...string) []string {
	out := []string{Supervisor, Planner}
	for _, p := range pools {
		out = append(out, "executor-"+p)
	}
	return out
}

// ForService returns the least-privilege permissions of a planex service,
// the rows of Table for its identity with "{pool}" replaced by its pool:
//
//   - supervisor: owns the JetStream resources and the run log: the whole
//     JetStream API, run logs, step requests, the engine inbox and timers,
//     every planex bucket and the shared output store.
//   - planner: its own plan cache bucket; nothing of runs, steps, the
//     catalog or outputs.
//   - executor-<pool>: its own pool's durable consumers on PLANEX_STEPS
//     and PLANEX_EVENTS (created only with the pool's filter), results and
//     started notices on planex.engine.*.{result,started}, its pool's
//     replicas' attempt queries, and its own pool's keys only in the tool
//     catalog, the effect records and the step replay bucket, its own
//     pool's output bucket (write only), and drafts (email pool). It can
//     neither publish step requests nor read run logs, another pool's keys,
//     steps or outputs; it can never purge, delete or update a stream.
//
// Every service subscribes only to its own inboxes (bus.InboxPrefix, which
// bus.Connect sets) for replies: not to _INBOX.>, where it could read the
// other services' replies, JetStream API answers included.
func ForService(service string) (Permissions, error) {
	p := Permissions{Subscribe: []string{bus.InboxPrefix(service) + ".>"}}
	pool := ""
	switch {
	case service == Supervisor || service == Planner:
	case strings.HasPrefix(service, Executor+"-"):
		pool = strings.TrimPrefix(service, Executor+"-")
		if !bus.ValidToken(pool) {
			return Permissions{}, fmt.Errorf("NATS permissions: pool %q: not a subject token", pool)
		}
		p.Responses = true
	default:
		return Permissions{}, fmt.Errorf("NATS permissions: unknown service %q: want supervisor, planner or executor-<pool>", service)
	}
	for _, g := range table {
		if g.Identity != service && (g.Identity != Executor || pool == "") {
			continue
		}
		for _, s := range g.Publish {
			p.Publish = append(p.Publish, strings.ReplaceAll(s, poolVar, pool))
		}
		for _, s := range g.Subscribe {
			p.Subscribe = append(p.Subscribe, strings.ReplaceAll(s, poolVar, pool))
		}
	}
	return p, nil
}

// Markdown renders Table as the Markdown table docs/security.md carries
// (TestSecurityDocTable keeps them equal): one row per grant, subjects in
// code spans, "<pool>" for the executor's pool.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| identity | resource | may | NATS subjects (publish; subscribe) |\n|---|---|---|---|\n")
	cell := func(s string) string {
		s = strings.ReplaceAll(s, poolVar, "<pool>")
		return strings.NewReplacer("|", "\\|", "<", "&lt;", "*", "\\*").Replace(s)
	}
	code := func(l []string) string {
		q := make([]string, len(l))
		for i, s := range l {
			q[i] = "`" + strings.ReplaceAll(strings.ReplaceAll(s, poolVar, "<pool>"), "|", "\\|") + "`"
		}
		return strings.Join(q, " ")
	}
	for _, g := range table {
		who := g.Identity
		if who == Executor {
			who = "executor-<pool>"
		}
		subjects := code(g.Publish)
		if len(g.Subscribe) > 0 {
			subjects += "; subscribe " + code(g.Subscribe)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell(who), cell(g.Resource), cell(g.Access), subjects)
	}
	b.WriteString("| every identity | its replies | subscribe to its own inboxes only | subscribe `_INBOX_<identity>.>` |\n")
	return b.String()
}

// ServerConfig renders the authorization block of a nats-server
// configuration file with one nkey user per service (nkeys maps service
// to its public nkey) — what deploy/k8s's nats.conf carries.
func ServerConfig(nkeys map[string]string) (string, error) {
	var b strings.Builder
	b.WriteString("authorization {\n  users = [\n")
	if err := writeUsers(&b, "    ", nkeys); err != nil {
		return "", err
	}
	b.WriteString("  ]\n}\n")
	return b.String(), nil
}

// writeUsers writes one nkey user entry per service of nkeys (sorted by
// service), each line indented by indent, with its ForService permissions.
func writeUsers(b *strings.Builder, indent string, nkeys map[string]string) error {
	names := make([]string, 0, len(nkeys))
	for n := range nkeys {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		p, err := ForService(n)
		if err != nil {
			return err
		}
		responses := ""
		if p.Responses {
			responses = indent + "    allow_responses: { max: 1, expires: \"1m\" }\n"
		}
		fmt.Fprintf(b, "%[1]s# %[2]s\n%[1]s{\n%[1]s  nkey: %[3]q\n%[1]s  permissions: {\n%[1]s    publish: { allow: %[4]s }\n%[1]s    subscribe: { allow: %[5]s }\n%[6]s%[1]s  }\n%[1]s}\n",
			indent, n, nkeys[n], quoteList(p.Publish), quoteList(p.Subscribe), responses)
	}
	return nil
}

func quoteList(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
