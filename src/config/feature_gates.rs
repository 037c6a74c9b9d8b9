//! The feature gates upstream kube-proxy 1.35 knows (every Kubernetes gate its binary registers:
//! pkg/features, the generic apiserver's, apiextensions', controller-manager's, client-go's,
//! component-base's logging and zpages gates, AllAlpha/AllBeta), each with its stage, default and
//! whether it is locked to its default, as of 1.35. `--feature-gates` and the file's
//! `featureGates` are checked against it as upstream checks them.

/// A gate's stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    Ga,
    Deprecated,
}

impl Stage {
    /// As `kubernetes_feature_enabled{stage}` spells it (GA is empty).
    pub fn label(self) -> &'static str {
        match self {
            Stage::Alpha => "ALPHA",
            Stage::Beta => "BETA",
            Stage::Ga => "",
            Stage::Deprecated => "DEPRECATED",
        }
    }
}

/// Why a feature gate setting is refused (the words are upstream's).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("unrecognized feature gate: {0}")]
    Unknown(String),
    #[error("cannot set feature gate {name} to {value}, feature is locked to {default}")]
    Locked {
        name: String,
        value: bool,
        default: bool,
    },
}

/// Checks `gates` (name -> value); returns warnings for GA and deprecated gates that are set.
pub fn check(gates: &std::collections::BTreeMap<String, bool>) -> Result<Vec<String>, GateError> {
    let mut warnings = Vec::new();
    for (name, value) in gates {
        let Some((_, stage, default, locked)) = KNOWN.iter().find(|(n, ..)| n == name) else {
            return Err(GateError::Unknown(name.clone()));
        };
        if *locked && value != default {
            return Err(GateError::Locked {
                name: name.clone(),
                value: *value,
                default: *default,
            });
        }
        match stage {
            Stage::Ga => warnings.push(format!(
                "Setting GA feature gate {name}={value}. It will be removed in a future release."
            )),
            Stage::Deprecated => warnings.push(format!(
                "Setting deprecated feature gate {name}={value}. It will be removed in a future release."
            )),
            _ => {}
        }
    }
    Ok(warnings)
}

/// Whether `name` is on, given what was set.
pub fn enabled(gates: &std::collections::BTreeMap<String, bool>, name: &str) -> bool {
    gates.get(name).copied().unwrap_or_else(|| {
        KNOWN
            .iter()
            .find(|(n, ..)| *n == name)
            .is_some_and(|(_, _, default, _)| *default)
    })
}

/// `(name, stage, default, locked to default)`, sorted by name.
pub const KNOWN: &[(&str, Stage, bool, bool)] = &[
    ("APIResponseCompression", Stage::Beta, true, false),
    ("APIServerIdentity", Stage::Beta, true, false),
    ("APIServerTracing", Stage::Ga, true, true),
    ("APIServingWithRoutine", Stage::Alpha, false, false),
    (
        "AggregatedDiscoveryRemoveBetaType",
        Stage::Deprecated,
        true,
        true,
    ),
    ("AllAlpha", Stage::Alpha, false, false),
    ("AllBeta", Stage::Beta, false, false),
    ("AllowDNSOnlyNodeCSR", Stage::Deprecated, false, false),
    (
        "AllowInsecureKubeletCertificateSigningRequests",
        Stage::Deprecated,
        false,
        false,
    ),
    (
        "AllowOverwriteTerminationGracePeriodSeconds",
        Stage::Deprecated,
        false,
        true,
    ),
    ("AllowParsingUserUIDFromCertAuth", Stage::Beta, true, false),
    (
        "AllowUnsafeMalformedObjectDeletion",
        Stage::Alpha,
        false,
        false,
    ),
    ("AnonymousAuthConfigurableEndpoints", Stage::Ga, true, true),
    ("AnyVolumeDataSource", Stage::Ga, true, true),
    ("AuthorizeNodeWithSelectors", Stage::Ga, true, true),
    (
        "AuthorizePodWebsocketUpgradeCreatePermission",
        Stage::Beta,
        true,
        false,
    ),
    ("AuthorizeWithSelectors", Stage::Ga, true, true),
    ("BtreeWatchCache", Stage::Ga, true, true),
    ("CBORServingAndStorage", Stage::Alpha, false, false),
    ("CPUManagerPolicyAlphaOptions", Stage::Alpha, false, false),
    ("CPUManagerPolicyBetaOptions", Stage::Beta, true, false),
    ("CPUManagerPolicyOptions", Stage::Ga, true, true),
    ("CRDObservedGenerationTracking", Stage::Beta, false, false),
    ("CRDValidationRatcheting", Stage::Ga, true, true),
    ("CSIMigrationPortworx", Stage::Ga, true, true),
    ("CSIServiceAccountTokenSecrets", Stage::Beta, true, false),
    ("CSIVolumeHealth", Stage::Alpha, false, false),
    (
        "ChangeContainerStatusOnKubeletRestart",
        Stage::Deprecated,
        false,
        false,
    ),
    (
        "ClearingNominatedNodeNameAfterBinding",
        Stage::Beta,
        true,
        false,
    ),
    ("ClientsAllowCBOR", Stage::Alpha, false, false),
    ("ClientsPreferCBOR", Stage::Alpha, false, false),
    (
        "CloudControllerManagerWatchBasedRoutesReconciliation",
        Stage::Alpha,
        false,
        false,
    ),
    ("CloudControllerManagerWebhook", Stage::Alpha, false, false),
    ("ClusterTrustBundle", Stage::Beta, false, false),
    ("ClusterTrustBundleProjection", Stage::Beta, false, false),
    ("ComponentFlagz", Stage::Alpha, false, false),
    ("ComponentStatusz", Stage::Alpha, false, false),
    ("ConcurrentWatchObjectDecode", Stage::Beta, false, false),
    ("ConsistentListFromCache", Stage::Ga, true, true),
    ("ConstrainedImpersonation", Stage::Alpha, false, false),
    ("ContainerCheckpoint", Stage::Beta, true, false),
    ("ContainerRestartRules", Stage::Beta, true, false),
    ("ContainerStopSignals", Stage::Alpha, false, false),
    ("ContextualLogging", Stage::Beta, true, false),
    ("CoordinatedLeaderElection", Stage::Beta, false, false),
    ("CrossNamespaceVolumeDataSource", Stage::Alpha, false, false),
    ("CustomCPUCFSQuotaPeriod", Stage::Alpha, false, false),
    ("CustomResourceFieldSelectors", Stage::Ga, true, true),
    ("DRAAdminAccess", Stage::Beta, true, false),
    ("DRAConsumableCapacity", Stage::Alpha, false, false),
    ("DRADeviceBindingConditions", Stage::Alpha, false, false),
    ("DRADeviceTaintRules", Stage::Alpha, false, false),
    ("DRADeviceTaints", Stage::Alpha, false, false),
    ("DRAExtendedResource", Stage::Alpha, false, false),
    ("DRAPartitionableDevices", Stage::Alpha, false, false),
    ("DRAPrioritizedList", Stage::Beta, true, false),
    ("DRAResourceClaimDeviceStatus", Stage::Beta, true, false),
    ("DRASchedulerFilterTimeout", Stage::Beta, true, false),
    ("DeclarativeValidation", Stage::Beta, true, false),
    ("DeclarativeValidationTakeover", Stage::Beta, false, false),
    (
        "DeploymentReplicaSetTerminatingReplicas",
        Stage::Beta,
        true,
        false,
    ),
    ("DetectCacheInconsistency", Stage::Beta, true, false),
    ("DisableAllocatorDualWrite", Stage::Ga, true, true),
    ("DisableCPUQuotaWithExclusiveCPUs", Stage::Beta, true, false),
    (
        "DisableNodeKubeProxyVersion",
        Stage::Deprecated,
        true,
        false,
    ),
    ("DynamicResourceAllocation", Stage::Ga, true, true),
    ("EnvFiles", Stage::Beta, true, false),
    ("EventedPLEG", Stage::Alpha, false, false),
    ("ExecProbeTimeout", Stage::Ga, true, true),
    (
        "ExternalServiceAccountTokenSigner",
        Stage::Beta,
        true,
        false,
    ),
    ("GangScheduling", Stage::Alpha, false, false),
    ("GenericWorkload", Stage::Alpha, false, false),
    ("GitRepoVolumeDriver", Stage::Deprecated, false, false),
    ("GracefulNodeShutdown", Stage::Beta, true, false),
    (
        "GracefulNodeShutdownBasedOnPodPriority",
        Stage::Beta,
        true,
        false,
    ),
    ("HPAConfigurableTolerance", Stage::Beta, true, false),
    ("HPAScaleToZero", Stage::Alpha, false, false),
    ("HonorPVReclaimPolicy", Stage::Ga, true, true),
    ("HostnameOverride", Stage::Beta, true, false),
    ("ImageMaximumGCAge", Stage::Ga, true, true),
    ("ImageVolume", Stage::Beta, true, false),
    ("ImageVolumeWithDigest", Stage::Alpha, false, false),
    ("InOrderInformers", Stage::Beta, true, false),
    ("InOrderInformersBatchProcess", Stage::Beta, true, false),
    (
        "InPlacePodLevelResourcesVerticalScaling",
        Stage::Alpha,
        false,
        false,
    ),
    ("InPlacePodVerticalScaling", Stage::Ga, true, true),
    (
        "InPlacePodVerticalScalingAllocatedStatus",
        Stage::Deprecated,
        false,
        false,
    ),
    (
        "InPlacePodVerticalScalingExclusiveCPUs",
        Stage::Alpha,
        false,
        false,
    ),
    (
        "InPlacePodVerticalScalingExclusiveMemory",
        Stage::Alpha,
        false,
        false,
    ),
    ("InTreePluginPortworxUnregister", Stage::Alpha, false, false),
    ("InformerResourceVersion", Stage::Ga, true, false),
    ("JobBackoffLimitPerIndex", Stage::Ga, true, true),
    ("JobManagedBy", Stage::Ga, true, true),
    ("JobPodReplacementPolicy", Stage::Ga, true, true),
    ("JobSuccessPolicy", Stage::Ga, true, true),
    ("KMSv1", Stage::Deprecated, false, false),
    ("KubeletCgroupDriverFromCRI", Stage::Ga, true, true),
    ("KubeletCrashLoopBackOffMax", Stage::Beta, true, false),
    ("KubeletEnsureSecretPulledImages", Stage::Beta, true, false),
    ("KubeletFineGrainedAuthz", Stage::Beta, true, false),
    ("KubeletInUserNamespace", Stage::Alpha, false, false),
    ("KubeletPSI", Stage::Beta, true, false),
    (
        "KubeletPodResourcesDynamicResources",
        Stage::Beta,
        true,
        false,
    ),
    ("KubeletPodResourcesGet", Stage::Beta, true, false),
    (
        "KubeletPodResourcesListUseActivePods",
        Stage::Deprecated,
        true,
        false,
    ),
    (
        "KubeletRegistrationGetOnExistsOnly",
        Stage::Deprecated,
        false,
        false,
    ),
    ("KubeletSeparateDiskGC", Stage::Beta, true, false),
    (
        "KubeletServiceAccountTokenForCredentialProviders",
        Stage::Beta,
        true,
        false,
    ),
    ("KubeletTracing", Stage::Ga, true, true),
    ("ListFromCacheSnapshot", Stage::Beta, true, false),
    (
        "LocalStorageCapacityIsolationFSQuotaMonitoring",
        Stage::Beta,
        false,
        false,
    ),
    ("LogarithmicScaleDown", Stage::Ga, true, true),
    ("LoggingAlphaOptions", Stage::Alpha, false, false),
    ("LoggingBetaOptions", Stage::Beta, true, false),
    ("MatchLabelKeysInPodAffinity", Stage::Ga, true, true),
    (
        "MatchLabelKeysInPodTopologySpread",
        Stage::Beta,
        true,
        false,
    ),
    (
        "MatchLabelKeysInPodTopologySpreadSelectorMerge",
        Stage::Beta,
        true,
        false,
    ),
    ("MaxUnavailableStatefulSet", Stage::Beta, true, false),
    ("MemoryManager", Stage::Ga, true, true),
    ("MemoryQoS", Stage::Alpha, false, false),
    ("MultiCIDRServiceAllocator", Stage::Ga, true, true),
    ("MutableCSINodeAllocatableCount", Stage::Beta, true, false),
    ("MutablePVNodeAffinity", Stage::Alpha, false, false),
    (
        "MutablePodResourcesForSuspendedJobs",
        Stage::Alpha,
        false,
        false,
    ),
    (
        "MutableSchedulingDirectivesForSuspendedJobs",
        Stage::Alpha,
        false,
        false,
    ),
    ("MutatingAdmissionPolicy", Stage::Beta, false, false),
    ("NFTablesProxyMode", Stage::Ga, true, true),
    ("NodeDeclaredFeatures", Stage::Alpha, false, false),
    (
        "NodeInclusionPolicyInPodTopologySpread",
        Stage::Ga,
        true,
        true,
    ),
    ("NodeLogQuery", Stage::Beta, false, false),
    ("NodeSwap", Stage::Ga, true, true),
    ("NominatedNodeNameForExpectation", Stage::Beta, true, false),
    ("OpenAPIEnums", Stage::Beta, true, false),
    ("OpportunisticBatching", Stage::Beta, true, false),
    ("OrderedNamespaceDeletion", Stage::Ga, true, true),
    ("PodAndContainerStatsFromCRI", Stage::Alpha, false, false),
    ("PodCertificateRequest", Stage::Beta, false, false),
    ("PodDeletionCost", Stage::Beta, true, false),
    ("PodLevelResources", Stage::Beta, true, false),
    ("PodLifecycleSleepAction", Stage::Ga, true, true),
    ("PodLifecycleSleepActionAllowZero", Stage::Ga, true, true),
    ("PodLogsQuerySplitStreams", Stage::Alpha, false, false),
    ("PodObservedGenerationTracking", Stage::Ga, true, true),
    (
        "PodReadyToStartContainersCondition",
        Stage::Beta,
        true,
        false,
    ),
    ("PodSchedulingReadiness", Stage::Ga, true, true),
    ("PodTopologyLabelsAdmission", Stage::Beta, true, false),
    ("PortForwardWebsockets", Stage::Beta, true, false),
    ("PreferSameTrafficDistribution", Stage::Ga, true, true),
    ("PreventStaticPodAPIReferences", Stage::Beta, true, false),
    ("ProcMountType", Stage::Beta, true, false),
    ("QOSReserved", Stage::Alpha, false, false),
    ("RecoverVolumeExpansionFailure", Stage::Ga, true, true),
    ("RecursiveReadOnlyMounts", Stage::Ga, true, true),
    (
        "ReduceDefaultCrashLoopBackOffDecay",
        Stage::Alpha,
        false,
        false,
    ),
    ("RelaxedDNSSearchValidation", Stage::Ga, true, true),
    (
        "RelaxedEnvironmentVariableValidation",
        Stage::Ga,
        true,
        true,
    ),
    ("RelaxedServiceNameValidation", Stage::Alpha, false, false),
    (
        "ReloadKubeletServerCertificateFile",
        Stage::Beta,
        true,
        false,
    ),
    ("RemoteRequestHeaderUID", Stage::Beta, true, false),
    ("ResilientWatchCacheInitialization", Stage::Ga, true, true),
    ("ResourceHealthStatus", Stage::Alpha, false, false),
    (
        "RestartAllContainersOnContainerExits",
        Stage::Alpha,
        false,
        false,
    ),
    ("RetryGenerateName", Stage::Ga, true, true),
    ("RotateKubeletServerCertificate", Stage::Beta, true, false),
    ("RuntimeClassInImageCriApi", Stage::Alpha, false, false),
    ("SELinuxChangePolicy", Stage::Beta, true, false),
    ("SELinuxMount", Stage::Beta, false, false),
    ("SELinuxMountReadWriteOncePod", Stage::Beta, true, false),
    ("SchedulerAsyncAPICalls", Stage::Beta, false, false),
    ("SchedulerAsyncPreemption", Stage::Beta, true, false),
    ("SchedulerPopFromBackoffQ", Stage::Beta, true, false),
    ("SchedulerQueueingHints", Stage::Ga, true, true),
    ("SeparateCacheWatchRPC", Stage::Deprecated, false, false),
    ("SeparateTaintEvictionController", Stage::Ga, true, true),
    (
        "ServiceAccountNodeAudienceRestriction",
        Stage::Beta,
        true,
        false,
    ),
    ("ServiceAccountTokenJTI", Stage::Ga, true, true),
    ("ServiceAccountTokenNodeBinding", Stage::Ga, true, true),
    (
        "ServiceAccountTokenNodeBindingValidation",
        Stage::Ga,
        true,
        true,
    ),
    ("ServiceAccountTokenPodNodeInfo", Stage::Ga, true, true),
    ("ServiceTrafficDistribution", Stage::Ga, true, true),
    ("SidecarContainers", Stage::Ga, true, true),
    ("SizeBasedListCostEstimate", Stage::Beta, true, false),
    (
        "StatefulSetSemanticRevisionComparison",
        Stage::Beta,
        true,
        false,
    ),
    ("StorageCapacityScoring", Stage::Alpha, false, false),
    ("StorageNamespaceIndex", Stage::Deprecated, true, false),
    ("StorageVersionAPI", Stage::Alpha, false, false),
    ("StorageVersionHash", Stage::Beta, true, false),
    ("StorageVersionMigrator", Stage::Beta, false, false),
    ("StreamingCollectionEncodingToJSON", Stage::Ga, true, true),
    (
        "StreamingCollectionEncodingToProtobuf",
        Stage::Ga,
        true,
        true,
    ),
    ("StrictIPCIDRValidation", Stage::Alpha, false, false),
    (
        "StructuredAuthenticationConfiguration",
        Stage::Ga,
        true,
        true,
    ),
    (
        "StructuredAuthenticationConfigurationEgressSelector",
        Stage::Beta,
        true,
        false,
    ),
    (
        "StructuredAuthenticationConfigurationJWKSMetrics",
        Stage::Beta,
        true,
        false,
    ),
    (
        "StructuredAuthorizationConfiguration",
        Stage::Ga,
        true,
        true,
    ),
    ("SupplementalGroupsPolicy", Stage::Ga, true, true),
    ("SystemdWatchdog", Stage::Ga, true, true),
    (
        "TaintTolerationComparisonOperators",
        Stage::Alpha,
        false,
        false,
    ),
    (
        "TokenRequestServiceAccountUIDValidation",
        Stage::Beta,
        true,
        false,
    ),
    ("TopologyAwareHints", Stage::Ga, true, true),
    (
        "TopologyManagerPolicyAlphaOptions",
        Stage::Alpha,
        false,
        false,
    ),
    ("TopologyManagerPolicyBetaOptions", Stage::Beta, true, false),
    ("TopologyManagerPolicyOptions", Stage::Ga, true, false),
    (
        "TranslateStreamCloseWebsocketRequests",
        Stage::Beta,
        true,
        false,
    ),
    (
        "UnauthenticatedHTTP2DOSMitigation",
        Stage::Beta,
        true,
        false,
    ),
    (
        "UnknownVersionInteroperabilityProxy",
        Stage::Alpha,
        false,
        false,
    ),
    (
        "UserNamespacesHostNetworkSupport",
        Stage::Alpha,
        false,
        false,
    ),
    ("UserNamespacesSupport", Stage::Beta, true, false),
    ("VolumeAttributesClass", Stage::Ga, true, false),
    ("VolumeLimitScaling", Stage::Alpha, false, false),
    (
        "WatchCacheInitializationPostStartHook",
        Stage::Beta,
        false,
        false,
    ),
    (
        "WatchFromStorageWithoutResourceVersion",
        Stage::Deprecated,
        false,
        true,
    ),
    ("WatchList", Stage::Beta, true, false),
    ("WatchListClient", Stage::Beta, true, false),
    ("WinDSR", Stage::Ga, true, true),
    ("WinOverlay", Stage::Ga, true, true),
    ("WindowsCPUAndMemoryAffinity", Stage::Alpha, false, false),
    ("WindowsGracefulNodeShutdown", Stage::Beta, true, false),
    ("WindowsHostNetwork", Stage::Deprecated, false, false),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn gates(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
    }

    #[test]
    fn gates_are_checked_as_upstream_checks_them() {
        assert!(
            check(&gates(&[("LoggingAlphaOptions", true)]))
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            check(&gates(&[("DynamicKubeletConfig", false)])),
            Err(GateError::Unknown("DynamicKubeletConfig".into()))
        );
        assert!(matches!(
            check(&gates(&[("NFTablesProxyMode", false)])),
            Err(GateError::Locked { .. })
        ));
        let warnings = check(&gates(&[("NFTablesProxyMode", true)])).unwrap();
        assert!(warnings[0].contains("Setting GA feature gate NFTablesProxyMode=true"));
        assert!(enabled(&gates(&[]), "PreferSameTrafficDistribution"));
        assert!(!enabled(&gates(&[]), "AllAlpha"));
    }

    #[test]
    fn the_list_is_sorted_and_has_no_duplicates() {
        assert!(KNOWN.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(KNOWN.len() > 200);
    }
}
