package api

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// RunFilter limits.
const (
	maxGoalWordsBytes = 256
	maxFilterTools    = 64
	maxFilterRunIDs   = 1000
	maxFilterStatuses = 32
	maxToolName       = 128
)

// toolNameRE is what a tool name in a filter may look like ("sql.query").
var toolNameRE = regexp.MustCompile(`^[A-Za-z0-9_.:/-]{1,128}$`)

// compileFilter validates a filter and compiles it into an index query,
// naming the offending field under prefix ("filter." or "") in errors.
// The legacy statuses and labels of ListRunsRequest are AND-ed by the
// caller (withLegacy).
func compileFilter(f *planexv1.RunFilter, prefix string) (*runlog.Query, error) {
	q := &runlog.Query{}
	if f == nil {
		return q, nil
	}
	var errs []error
	if n := len(f.GetStatuses()); n > maxFilterStatuses {
		errs = append(errs, invalid("%sstatuses: %d statuses, at most %d", prefix, n, maxFilterStatuses))
	}
	for i, st := range f.GetStatuses() {
		if _, ok := planexv1.RunStatus_name[int32(st)]; !ok || st == planexv1.RunStatus_RUN_STATUS_UNSPECIFIED {
			errs = append(errs, invalid("%sstatuses[%d]: %d is not a run status", prefix, i, st))
			continue
		}
		q.Statuses = append(q.Statuses, st)
	}
	if err := checkLabelsFilter(prefix+"labels", f.GetLabels()); err != nil {
		errs = append(errs, err)
	}
	var labelTests []func(get func(string) (string, bool)) bool
	if labels := f.GetLabels(); len(labels) > 0 {
		labelTests = append(labelTests, labelsEqual(labels))
	}
	if sel := f.GetLabelSelector(); sel != "" {
		parsed, err := parseSelector(sel)
		if err != nil {
			errs = append(errs, invalid("%slabel_selector: %v", prefix, err))
		} else if len(parsed) > 0 {
			labelTests = append(labelTests, parsed.matches)
		}
	}
	q.Labels = allOf(labelTests)
	if g := f.GetGoalContains(); g != "" {
		switch {
		case len(g) > maxGoalWordsBytes:
			errs = append(errs, invalid("%sgoal_contains: %d bytes, at most %d", prefix, len(g), maxGoalWordsBytes))
		case !utf8.ValidString(g):
			errs = append(errs, invalid("%sgoal_contains: not valid UTF-8", prefix))
		default:
			q.GoalWords = strings.Fields(strings.ToLower(g))
		}
	}
	if n := len(f.GetTools()); n > maxFilterTools {
		errs = append(errs, invalid("%stools: %d tools, at most %d", prefix, n, maxFilterTools))
	}
	for i, t := range f.GetTools() {
		if !toolNameRE.MatchString(t) {
			errs = append(errs, invalid("%stools[%d] %q: want a tool name like \"sql.query\"", prefix, i, clip(t)))
			continue
		}
		q.Tools = append(q.Tools, t)
	}
	if sb := f.GetStartedBy(); sb != "" {
		if len(sb) > maxActorBytes || !utf8.ValidString(sb) {
			errs = append(errs, invalid("%sstarted_by: want valid UTF-8 of at most %d bytes", prefix, maxActorBytes))
		}
		q.StartedBy = sb
	}
	if ts := f.GetCreatedAfter(); ts != nil {
		if err := ts.CheckValid(); err != nil {
			errs = append(errs, invalid("%screated_after: %v", prefix, err))
		}
		q.CreatedAfter = ts.AsTime()
	}
	if ts := f.GetCreatedBefore(); ts != nil {
		if err := ts.CheckValid(); err != nil {
			errs = append(errs, invalid("%screated_before: %v", prefix, err))
		}
		q.CreatedBefore = ts.AsTime()
	}
	if f.GetCreatedAfter() != nil && f.GetCreatedBefore() != nil && !q.CreatedAfter.Before(q.CreatedBefore) {
		errs = append(errs, invalid("%screated_after %s: must be before created_before %s", prefix,
			q.CreatedAfter.UTC().Format("2006-01-02T15:04:05Z07:00"), q.CreatedBefore.UTC().Format("2006-01-02T15:04:05Z07:00")))
	}
	if n := len(f.GetStopReasons()); n > maxFilterStatuses {
		errs = append(errs, invalid("%sstop_reasons: %d stop reasons, at most %d", prefix, n, maxFilterStatuses))
	}
	for i, r := range f.GetStopReasons() {
		if _, ok := planexv1.StopReason_name[int32(r)]; !ok || r == planexv1.StopReason_STOP_REASON_UNSPECIFIED {
			errs = append(errs, invalid("%sstop_reasons[%d]: %d is not a stop reason", prefix, i, r))
			continue
		}
		q.StopReasons = append(q.StopReasons, r)
	}
	q.Waiting = f.GetWaitingForDecision()
	if n := len(f.GetRunIds()); n > maxFilterRunIDs {
		errs = append(errs, invalid("%srun_ids: %d ids, at most %d", prefix, n, maxFilterRunIDs))
	} else if n > 0 {
		q.RunIDs = make(map[string]bool, n)
		for i, id := range f.GetRunIds() {
			if err := validRunID(id); err != nil {
				errs = append(errs, invalid("%srun_ids[%d]: %v", prefix, i, err))
				continue
			}
			q.RunIDs[id] = true
		}
	}
	if id := f.GetForkedFrom(); id != "" {
		if err := validRunID(id); err != nil {
			errs = append(errs, invalid("%sforked_from: %v", prefix, err))
		}
		q.ForkedFrom = id
	}
	if id := f.GetParentRunId(); id != "" {
		if err := validRunID(id); err != nil {
			errs = append(errs, invalid("%sparent_run_id: %v", prefix, err))
		}
		q.ParentRunID = id
	}
	if len(errs) > 0 {
		return nil, joinInvalid(errs)
	}
	return q, nil
}

// checkLabelsFilter validates the labels of a filter like StartRun's.
func checkLabelsFilter(field string, labels map[string]string) error {
	if n := len(labels); n > maxLabels {
		return invalid("%s: %d labels, at most %d", field, n, maxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if !labelKeyRE.MatchString(k) {
			return invalid("%s: key %q: want 1 to 63 of [a-z0-9_./-]", field, clip(k))
		}
		if v := labels[k]; len(v) > maxLabelValue || !utf8.ValidString(v) {
			return invalid("%s[%q]: value must be valid UTF-8 of at most %d bytes", field, k, maxLabelValue)
		}
	}
	return nil
}

// labelsEqual tests that every label of want is set to its value.
func labelsEqual(want map[string]string) func(get func(string) (string, bool)) bool {
	return func(get func(string) (string, bool)) bool {
		for k, v := range want {
			if got, ok := get(k); !ok || got != v {
				return false
			}
		}
		return true
	}
}

func allOf(tests []func(get func(string) (string, bool)) bool) func(get func(string) (string, bool)) bool {
	switch len(tests) {
	case 0:
		return nil
	case 1:
		return tests[0]
	}
	return func(get func(string) (string, bool)) bool {
		for _, t := range tests {
			if !t(get) {
				return false
			}
		}
		return true
	}
}

// listQuery compiles a ListRunsRequest's conditions: its filter AND-ed
// with the legacy statuses and labels.
func listQuery(req *planexv1.ListRunsRequest) (*runlog.Query, error) {
	q, err := compileFilter(req.GetFilter(), "filter.")
	if err != nil {
		return nil, err
	}
	legacy, err := compileFilter(&planexv1.RunFilter{Statuses: req.GetStatuses(), Labels: req.GetLabels()}, "")
	if err != nil {
		return nil, err
	}
	if len(legacy.Statuses) > 0 {
		if len(q.Statuses) == 0 {
			q.Statuses = legacy.Statuses
		} else {
			// Both: a run's status must be in each list.
			q.Statuses = slices.DeleteFunc(q.Statuses, func(s planexv1.RunStatus) bool { return !slices.Contains(legacy.Statuses, s) })
			if len(q.Statuses) == 0 {
				q.Statuses = []planexv1.RunStatus{planexv1.RunStatus_RUN_STATUS_UNSPECIFIED} // matches no run
			}
		}
	}
	if legacy.Labels != nil {
		var tests []func(get func(string) (string, bool)) bool
		if q.Labels != nil {
			tests = append(tests, q.Labels)
		}
		q.Labels = allOf(append(tests, legacy.Labels))
	}
	return q, nil
}

// filterHash is a short hash of a ListRunsRequest's conditions, put in its
// page tokens so that a token is refused with another filter.
func filterHash(req *planexv1.ListRunsRequest) string {
	c := &planexv1.ListRunsRequest{Statuses: req.GetStatuses(), Labels: req.GetLabels(), Filter: req.GetFilter()}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return "x"
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}

// emptyFilter reports whether f sets no condition.
func emptyFilter(f *planexv1.RunFilter) bool { return f == nil || proto.Size(f) == 0 }
