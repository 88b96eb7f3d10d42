//! The pod template's volumes under `tfjob run`: each volume the `tensorflow`
//! container mounts becomes a directory of this machine.
//!
//! | volume | directory |
//! |---|---|
//! | `persistentVolumeClaim` | `<run dir>/volumes/claims/<claimName>`: one per claim, shared by every replica of the job that mounts it, as a ReadWriteMany volume is |
//! | `emptyDir` | `<run dir>/volumes/pods/<pod>/<volume>`: one per replica, kept across its restarts (a pod's emptyDir outlives its container's restarts) |
//! | `hostPath` | the path itself |
//!
//! Other kinds (configMap, secret, projected, ...) are not mapped: the
//! replica sees the machine's own files at their mount paths, and the run
//! says so once. A `subPath` selects a directory inside the volume's.
//!
//! The container backend bind-mounts each directory at its `mountPath`. A
//! process cannot mount anything, so the process backend maps paths instead:
//! in the command, the args and the env values, a path under a `mountPath`
//! (`/mnt/shared`, `/mnt/shared/ckpt`, also as the value of `--flag=VALUE`)
//! is rewritten to the same path under the volume's directory. The manifest
//! runs as written, no replica needs root (no chroot, no bind mount, no
//! symlink at an absolute path shared by every run of the machine), and two
//! runs of one manifest never share a directory.

use std::path::{Component, Path, PathBuf};

use tfjob_api::plan::PlannedReplica;

/// One volume of a replica as a directory of this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalMount {
    /// The `mountPath` of the `tensorflow` container.
    pub mount_path: String,
    /// The directory it is on this machine.
    pub host_path: PathBuf,
    pub read_only: bool,
    /// Created by `tfjob run` (emptyDir, claims) rather than given (hostPath).
    pub created: bool,
}

/// The mounts of a replica that `tfjob run` maps, and the notes about those it leaves alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalVolumes {
    pub mounts: Vec<LocalMount>,
    pub notes: Vec<String>,
}

/// Where the volumes of a run live: `<run dir>/volumes`.
pub fn volumes_root(run_dir: &Path) -> PathBuf {
    run_dir.join("volumes")
}

/// The directory of a claim: `<run dir>/volumes/claims/<claimName>`.
pub fn claim_dir(run_dir: &Path, claim: &str) -> PathBuf {
    volumes_root(run_dir).join("claims").join(claim)
}

/// A name used as one path segment: not empty, no separator, not `.` or `..`.
fn segment<'a>(what: &str, name: &'a str) -> Result<&'a str, String> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(format!("{what} {name:?} cannot name a directory"));
    }
    Ok(name)
}

/// A relative path that stays inside its directory.
fn sub_path(sub: &str) -> Result<PathBuf, String> {
    let p = Path::new(sub);
    if p.components().all(|c| matches!(c, Component::Normal(_))) {
        Ok(p.to_path_buf())
    } else {
        Err(format!("subPath {sub:?} must be a relative path without `..`"))
    }
}

/// Maps the mounts of `replica` (pod `pod`) to directories of this machine,
/// for a run in `run_dir`. Pure: creates nothing.
pub fn local_volumes(run_dir: &Path, replica: &PlannedReplica) -> Result<LocalVolumes, String> {
    let mut out = LocalVolumes::default();
    for m in &replica.volume_mounts {
        let volume =
            replica.volumes.iter().find(|v| v.name == m.name).ok_or_else(|| format!("volumeMount {:?} names no volume of the pod template", m.name))?;
        if !m.mount_path.starts_with('/') {
            return Err(format!("volumeMount {:?}: mountPath {:?} is not absolute", m.name, m.mount_path));
        }
        let (dir, created) = if let Some(claim) = &volume.persistent_volume_claim {
            (claim_dir(run_dir, segment("claimName", &claim.claim_name)?), true)
        } else if volume.empty_dir.is_some() {
            (volumes_root(run_dir).join("pods").join(segment("pod", &replica.pod_name)?).join(segment("volume", &volume.name)?), true)
        } else if let Some(host) = &volume.host_path {
            (PathBuf::from(&host.path), false)
        } else {
            out.notes.push(format!(
                "volume {:?} ({}) is not mapped locally: paths under {} are this machine's own",
                volume.name,
                volume_kind(volume),
                m.mount_path
            ));
            continue;
        };
        let host_path = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => dir.join(sub_path(sub).map_err(|e| format!("volumeMount {:?}: {e}", m.name))?),
            None => dir,
        };
        out.mounts.push(LocalMount { mount_path: m.mount_path.trim_end_matches('/').to_string(), host_path, read_only: m.read_only.unwrap_or(false), created });
    }
    // Longest mount path first: a path is mapped by its innermost mount.
    out.mounts.sort_by(|a, b| b.mount_path.len().cmp(&a.mount_path.len()).then_with(|| a.mount_path.cmp(&b.mount_path)));
    Ok(out)
}

/// The kind of a volume, for messages.
fn volume_kind(v: &k8s_openapi::api::core::v1::Volume) -> &'static str {
    let kinds: [(&str, bool); 6] = [
        ("configMap", v.config_map.is_some()),
        ("secret", v.secret.is_some()),
        ("projected", v.projected.is_some()),
        ("downwardAPI", v.downward_api.is_some()),
        ("nfs", v.nfs.is_some()),
        ("csi", v.csi.is_some()),
    ];
    kinds.iter().find(|(_, is)| *is).map_or("another kind", |(k, _)| k)
}

/// Creates the directories `tfjob run` provides (emptyDir, claims, a
/// hostPath that is missing), writable by any user, as a container may run
/// as another user than `tfjob run`.
pub fn create_dirs(mounts: &[LocalMount]) -> std::io::Result<()> {
    for m in mounts {
        if m.created || !m.host_path.exists() {
            std::fs::create_dir_all(&m.host_path)?;
        }
        if m.created {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&m.host_path, std::fs::Permissions::from_mode(0o777))?;
        }
    }
    Ok(())
}

/// `value` with a leading path under a mount path mapped to the mount's
/// directory: the whole value, or the value of `--flag=VALUE` /
/// `NAME=VALUE`. Anything else is returned as it is.
pub fn map_path(value: &str, mounts: &[LocalMount]) -> String {
    let map = |path: &str| -> Option<String> {
        mounts.iter().find_map(|m| {
            let rest = path.strip_prefix(m.mount_path.as_str())?;
            (rest.is_empty() || rest.starts_with('/')).then(|| format!("{}{rest}", m.host_path.display()))
        })
    };
    if let Some(mapped) = map(value) {
        return mapped;
    }
    if let Some((flag, path)) = value.split_once('=')
        && let Some(mapped) = map(path)
    {
        return format!("{flag}={mapped}");
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, HostPathVolumeSource, PersistentVolumeClaimVolumeSource, Volume, VolumeMount};

    fn replica(volumes: Vec<Volume>, mounts: Vec<VolumeMount>) -> PlannedReplica {
        PlannedReplica {
            replica_type: tfjob_api::api::ReplicaType::PS,
            index: 0,
            pod_name: "job-ps-0".into(),
            restart_policy: tfjob_api::api::RestartPolicy::Never,
            port: 2222,
            address: String::new(),
            command: vec![],
            args: vec![],
            env: vec![],
            tf_config: None,
            is_master_role: false,
            volumes,
            volume_mounts: mounts,
        }
    }

    fn mount(name: &str, path: &str, sub: Option<&str>) -> VolumeMount {
        VolumeMount { name: name.into(), mount_path: path.into(), sub_path: sub.map(String::from), ..Default::default() }
    }

    fn claim(name: &str, claim: &str) -> Volume {
        Volume {
            name: name.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource { claim_name: claim.into(), read_only: None }),
            ..Default::default()
        }
    }

    #[test]
    fn each_kind_of_volume_has_its_directory() {
        let run = Path::new("/runs/r1");
        let volumes = vec![
            claim("shared", "training-data"),
            Volume { name: "scratch".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() },
            Volume { name: "host".into(), host_path: Some(HostPathVolumeSource { path: "/srv/data".into(), type_: None }), ..Default::default() },
            Volume { name: "model".into(), config_map: Some(Default::default()), ..Default::default() },
        ];
        let mounts = vec![
            mount("shared", "/mnt/shared/", None),
            mount("scratch", "/tmp/scratch", None),
            mount("host", "/data", Some("mnist")),
            mount("model", "/examples/keras", None),
            mount("shared", "/mnt/shared/logs", Some("tb")),
        ];
        let got = local_volumes(run, &replica(volumes, mounts)).unwrap();
        let pairs: Vec<(&str, String, bool)> = got.mounts.iter().map(|m| (m.mount_path.as_str(), m.host_path.display().to_string(), m.created)).collect();
        assert_eq!(
            pairs,
            [
                ("/mnt/shared/logs", "/runs/r1/volumes/claims/training-data/tb".to_string(), true),
                ("/tmp/scratch", "/runs/r1/volumes/pods/job-ps-0/scratch".to_string(), true),
                ("/mnt/shared", "/runs/r1/volumes/claims/training-data".to_string(), true),
                ("/data", "/srv/data/mnist".to_string(), false),
            ]
        );
        assert_eq!(got.notes.len(), 1);
        assert!(got.notes[0].contains("\"model\" (configMap) is not mapped"), "{:?}", got.notes);
    }

    #[test]
    fn bad_mounts_are_refused() {
        let run = Path::new("/runs/r1");
        let cases: [(Vec<Volume>, VolumeMount, &str); 4] = [
            (vec![], mount("gone", "/x", None), "names no volume"),
            (vec![claim("c", "ok")], mount("c", "relative", None), "not absolute"),
            (vec![claim("c", "../up")], mount("c", "/x", None), "cannot name a directory"),
            (vec![claim("c", "ok")], mount("c", "/x", Some("../escape")), "without `..`"),
        ];
        for (volumes, m, want) in cases {
            let err = local_volumes(run, &replica(volumes, vec![m])).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn paths_under_a_mount_are_mapped_in_values_and_flags() {
        let mounts = vec![
            LocalMount { mount_path: "/mnt/shared/logs".into(), host_path: "/r/claims/c/tb".into(), read_only: false, created: true },
            LocalMount { mount_path: "/mnt/shared".into(), host_path: "/r/claims/c".into(), read_only: false, created: true },
        ];
        let cases = [
            ("/mnt/shared", "/r/claims/c"),
            ("/mnt/shared/ckpt", "/r/claims/c/ckpt"),
            ("--checkpoint_dir=/mnt/shared/ckpt", "--checkpoint_dir=/r/claims/c/ckpt"),
            ("--log_dir=/mnt/shared/logs/run1", "--log_dir=/r/claims/c/tb/run1"),
            ("/mnt/sharedother", "/mnt/sharedother"),
            ("--data_dir=s3://bucket/mnt/shared", "--data_dir=s3://bucket/mnt/shared"),
            ("relative/mnt/shared", "relative/mnt/shared"),
            ("--sync_replicas", "--sync_replicas"),
            ("{\"cluster\":{}}", "{\"cluster\":{}}"),
        ];
        for (value, want) in cases {
            assert_eq!(map_path(value, &mounts), want, "{value}");
        }
    }

    #[test]
    fn created_directories_are_writable_by_anyone() {
        let dir = tempfile::tempdir().unwrap();
        let m = LocalMount { mount_path: "/m".into(), host_path: dir.path().join("claims/c"), read_only: false, created: true };
        create_dirs(std::slice::from_ref(&m)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&m.host_path).unwrap().permissions().mode() & 0o777, 0o777);
    }
}
