package authn

import (
	"maps"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// SupervisorPolicy is the role each SupervisorService method requires.
// CancelRun of another identity's run needs RoleAdmin and Decide on one's
// own run needs a self-approval policy; the API checks both.
var SupervisorPolicy = Policy{
	planexv1.SupervisorService_GetRun_FullMethodName:    RoleViewer,
	planexv1.SupervisorService_ListRuns_FullMethodName:  RoleViewer,
	planexv1.SupervisorService_WatchRun_FullMethodName:  RoleViewer,
	planexv1.SupervisorService_ListTools_FullMethodName: RoleViewer,
	planexv1.SupervisorService_ListGates_FullMethodName: RoleViewer,
	planexv1.SupervisorService_StartRun_FullMethodName:  RoleRunner,
	planexv1.SupervisorService_CancelRun_FullMethodName: RoleRunner,
	planexv1.SupervisorService_Decide_FullMethodName:    RoleApprover,
	planexv1.SupervisorService_ResetRun_FullMethodName:  RoleOperator,
	planexv1.SupervisorService_ForkRun_FullMethodName:   RoleOperator,
	planexv1.SupervisorService_RunBatch_FullMethodName:  RoleOperator,
}

// TenantPolicy is the role each TenantService method requires: managing
// tenants is the platform admin's; a tenant's own usage any viewer of it
// reads (another tenant's needs platform-admin, which the API checks).
var TenantPolicy = Policy{
	planexv1.TenantService_CreateTenant_FullMethodName: RolePlatformAdmin,
	planexv1.TenantService_GetTenant_FullMethodName:    RolePlatformAdmin,
	planexv1.TenantService_ListTenants_FullMethodName:  RolePlatformAdmin,
	planexv1.TenantService_UpdateTenant_FullMethodName: RolePlatformAdmin,
	planexv1.TenantService_DeleteTenant_FullMethodName: RolePlatformAdmin,
	planexv1.TenantService_GetUsage_FullMethodName:     RoleViewer,
}

// TriggerPolicy is the role each TriggerService method requires: viewers
// read triggers and their rejections; operators manage and fire them (a
// trigger starts runs as "trigger:<name>").
var TriggerPolicy = Policy{
	planexv1.TriggerService_GetTrigger_FullMethodName:            RoleViewer,
	planexv1.TriggerService_ListTriggers_FullMethodName:          RoleViewer,
	planexv1.TriggerService_ListTriggerRejections_FullMethodName: RoleViewer,
	planexv1.TriggerService_CreateTrigger_FullMethodName:         RoleOperator,
	planexv1.TriggerService_UpdateTrigger_FullMethodName:         RoleOperator,
	planexv1.TriggerService_DeleteTrigger_FullMethodName:         RoleOperator,
	planexv1.TriggerService_PauseTrigger_FullMethodName:          RoleOperator,
	planexv1.TriggerService_ResumeTrigger_FullMethodName:         RoleOperator,
	planexv1.TriggerService_FireTrigger_FullMethodName:           RoleOperator,
}

// SchedulePolicy is the role each ScheduleService method requires:
// reading schedules is a viewer's; anything that makes a schedule start
// runs (or stop starting them) needs the role that starts runs.
var SchedulePolicy = Policy{
	planexv1.ScheduleService_GetSchedule_FullMethodName:      RoleViewer,
	planexv1.ScheduleService_ListSchedules_FullMethodName:    RoleViewer,
	planexv1.ScheduleService_CreateSchedule_FullMethodName:   RoleRunner,
	planexv1.ScheduleService_UpdateSchedule_FullMethodName:   RoleRunner,
	planexv1.ScheduleService_DeleteSchedule_FullMethodName:   RoleRunner,
	planexv1.ScheduleService_PauseSchedule_FullMethodName:    RoleRunner,
	planexv1.ScheduleService_ResumeSchedule_FullMethodName:   RoleRunner,
	planexv1.ScheduleService_BackfillSchedule_FullMethodName: RoleRunner,
}

// PlannerPolicy: only the supervisor (an admin identity, its client
// certificate) asks for plans — a plan costs LLM tokens and shows the
// playbooks.
var PlannerPolicy = Policy{
	planexv1.PlannerService_Plan_FullMethodName: RoleAdmin,
}

// ExecutorPolicy: Describe shows the pool's tools; Execute (off by
// default) runs a step outside the queue: it needs an authenticated caller
// here, and the executor then requires the admin role or a step the
// supervisor signed (services/executor).
var ExecutorPolicy = Policy{
	planexv1.ExecutorService_Describe_FullMethodName: RoleViewer,
	planexv1.ExecutorService_Execute_FullMethodName:  RoleViewer,
}

// Health and reflection method names, public or not per flag.
const (
	HealthCheck = "/grpc.health.v1.Health/Check"
	HealthWatch = "/grpc.health.v1.Health/Watch"
	HealthList  = "/grpc.health.v1.Health/List"
	// ReflectionV1 and ReflectionV1Alpha are the reflection streams.
	ReflectionV1      = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
	ReflectionV1Alpha = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
)

// ServicePolicy is the policy of every planex gRPC service together
// (method names are unique), with health public when healthPublic and
// reflection open to viewers (public when reflectionPublic).
func ServicePolicy(healthPublic, reflectionPublic bool) Policy {
	p := Policy{}
	maps.Copy(p, SupervisorPolicy)
	maps.Copy(p, TenantPolicy)
	maps.Copy(p, SchedulePolicy)
	maps.Copy(p, TriggerPolicy)
	maps.Copy(p, PlannerPolicy)
	maps.Copy(p, ExecutorPolicy)
	health, refl := RoleViewer, RoleViewer
	if healthPublic {
		health = RoleNone
	}
	if reflectionPublic {
		refl = RoleNone
	}
	for _, m := range []string{HealthCheck, HealthWatch, HealthList} {
		p[m] = health
	}
	p[ReflectionV1], p[ReflectionV1Alpha] = refl, refl
	return p
}
