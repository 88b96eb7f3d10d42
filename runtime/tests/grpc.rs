//! The ps service over real gRPC (in-process server on 127.0.0.1): the job
//! token, TLS, and random malformed messages, none of which may crash the
//! server or change a variable.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use tfjob_runtime::auth::{Credentials, TaskTls};
use tfjob_runtime::client::{ModelVariable, NO_ROWS, PsSet, StepRequest, ps_client};
use tfjob_runtime::cluster::TaskId;
use tfjob_runtime::optimizer::Optimizer;
use tfjob_runtime::placement::{self, PlacementInput};
use tfjob_runtime::proto::{self, DataType, TensorPart, UpdateMode};
use tfjob_runtime::ps::{ParameterStore, PsConfig, PsService};
use tfjob_runtime::server::{self, WorkerService};
use tfjob_runtime::status::TaskStatus;
use tfjob_runtime::tensor::f32_to_bytes;

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

struct Server {
    addr: SocketAddr,
    store: Arc<ParameterStore>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(credentials: &Credentials) -> Server {
    let addr = free_addr();
    let store = Arc::new(ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("worker", 0)))));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let status = Arc::new(TaskStatus::new(TaskId::new("ps", 0)));
    server::serve(addr, Some(PsService::new(store.clone())), WorkerService::new(status, None), credentials, async {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    Server { addr, store, _stop: stop }
}

fn variables() -> Vec<ModelVariable> {
    vec![ModelVariable::dense("w", vec![4, 3]), ModelVariable::dense("b", vec![3])]
}

fn ps_set(addr: SocketAddr, credentials: &Credentials, task: u32) -> PsSet {
    ps_set_of(addr, credentials, task, variables())
}

fn ps_set_of(addr: SocketAddr, credentials: &Credentials, task: u32, vars: Vec<ModelVariable>) -> PsSet {
    let inputs: Vec<PlacementInput> = vars.iter().map(|v| PlacementInput::dense(v.name.clone(), v.shape.clone())).collect();
    let placement = placement::place(&inputs, 1, placement::DEFAULT_PARTITION_THRESHOLD_BYTES).unwrap();
    let config = proto::TrainingConfig {
        mode: UpdateMode::Async as i32,
        optimizer: Some(Optimizer::sgd(0.1).to_proto()),
        replicas_to_aggregate: 0,
        total_num_replicas: 0,
        elastic: false,
        follow_chief_aggregation: false,
    };
    PsSet::new(TaskId::new("worker", task), &[addr.to_string()], credentials, vars, placement, config, Duration::from_secs(5)).unwrap()
}

fn initial() -> Vec<ndarray::ArrayD<f32>> {
    vec![
        ndarray::ArrayD::from_shape_vec(vec![4, 3], (0..12).map(|i| i as f32).collect()).unwrap(),
        ndarray::ArrayD::from_shape_vec(vec![3], vec![1.0, 2.0, 3.0]).unwrap(),
    ]
}

/// A call without the token, or with a wrong one, is refused with
/// UNAUTHENTICATED and changes nothing, over gRPC and the tensor channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_is_required_and_refusals_change_nothing() {
    let good = Credentials { token: Some("right-token".into()), tls: None };
    let server = start(&good).await;
    let chief = ps_set(server.addr, &good, 0);
    chief.handshake(false).await.unwrap();
    chief.init(&initial(), 0).await.unwrap();
    let bad = [Credentials::default(), Credentials { token: Some("wrong-token".into()), tls: None }];
    for (bad, channel) in bad.iter().flat_map(|b| [(b, true), (b, false)]) {
        let mut intruder = ps_set(server.addr, bad, 1);
        intruder.set_tensor_channel(channel);
        let mut params = initial();
        let err = intruder.pull(&mut params, NO_ROWS, &[], false, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.code(), Some(tonic::Code::Unauthenticated), "channel {channel}: {err}");
        let err = intruder.handshake(false).await.unwrap_err();
        assert_eq!(err.code(), Some(tonic::Code::Unauthenticated), "{err}");
        let grads = vec![ndarray::ArrayD::from_elem(vec![4, 3], 100.0f32), ndarray::ArrayD::from_elem(vec![3], 100.0f32)];
        let err = intruder.push(&[0], &grads, NO_ROWS).await.unwrap_err();
        assert_eq!(err.code(), Some(tonic::Code::Unauthenticated), "{err}");
        let err = intruder.shutdown("intrusion", 0).await.unwrap_err();
        assert_eq!(err.code(), Some(tonic::Code::Unauthenticated), "{err}");
    }
    assert_eq!(server.store.values("b").unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(server.store.progress().step, 0);
    assert!(!server.store.progress().done);
    // The rightful worker still trains.
    let grads = vec![ndarray::ArrayD::from_elem(vec![4, 3], 1.0f32), ndarray::ArrayD::from_elem(vec![3], 10.0f32)];
    chief.push(&[0], &grads, NO_ROWS).await.unwrap();
    assert_eq!(server.store.values("b").unwrap(), vec![0.0, 1.0, 2.0]);
}

/// PushPull: one call applies the push and brings back the values after it;
/// a ps not pushed to is only pulled from; a push without the token changes
/// nothing. Over the tensor channel and over gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_pull_applies_then_returns_the_new_values() {
    for channel in [true, false] {
        push_pull_case(channel).await;
    }
}

async fn push_pull_case(channel: bool) {
    let good = Credentials { token: Some("right-token".into()), tls: None };
    let server = start(&good).await;
    let mut chief = ps_set(server.addr, &good, 0);
    chief.set_tensor_channel(channel);
    assert_eq!(chief.uses_tensor_channel(), channel);
    chief.handshake(false).await.unwrap();
    chief.init(&initial(), 0).await.unwrap();
    let grads = vec![ndarray::ArrayD::from_elem(vec![4, 3], 1.0f32), ndarray::ArrayD::from_elem(vec![3], 10.0f32)];
    let mut params = vec![ndarray::ArrayD::zeros(vec![4, 3]), ndarray::ArrayD::zeros(vec![3])];
    let stepped = chief
        .push_pull(
            StepRequest { steps: &[0], push_to: &[true], gradients: &grads, pushed_rows: NO_ROWS, pulled_rows: NO_ROWS, shard_call: None },
            &mut params,
            &[0],
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert!(stepped.pushed[0].accepted);
    assert_eq!((stepped.pushed[0].step, stepped.pulled.steps[0]), (1, 1));
    assert_eq!(params[1].as_slice().unwrap(), &[0.0, 1.0, 2.0]);
    assert_eq!(params[0].as_slice().unwrap(), server.store.values("w").unwrap().as_slice());
    // Pull only: nothing applied, the same values.
    let stepped = chief
        .push_pull(
            StepRequest { steps: &[1], push_to: &[false], gradients: &grads, pushed_rows: NO_ROWS, pulled_rows: NO_ROWS, shard_call: None },
            &mut params,
            &[0],
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert!(!stepped.pushed[0].accepted);
    assert_eq!(stepped.pulled.steps[0], 1);
    assert_eq!(server.store.values("b").unwrap(), vec![0.0, 1.0, 2.0]);
    let mut intruder = ps_set(server.addr, &Credentials::default(), 1);
    intruder.set_tensor_channel(channel);
    let err = intruder
        .push_pull(
            StepRequest { steps: &[1], push_to: &[true], gradients: &grads, pushed_rows: NO_ROWS, pulled_rows: NO_ROWS, shard_call: None },
            &mut params,
            &[0],
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unauthenticated), "{err}");
    assert_eq!(server.store.values("b").unwrap(), vec![0.0, 1.0, 2.0]);
    assert_eq!(server.store.progress().step, 1);
}

/// A step carries a call to the shard dispatcher of ps 0 and brings its
/// answer back; a call the dispatcher refuses does not undo the step. Over
/// the tensor channel (in the step's round trip) and over gRPC (after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_carries_a_call_to_the_shard_dispatcher() {
    for channel in [true, false] {
        let good = Credentials { token: Some("right-token".into()), tls: None };
        let server = start(&good).await;
        let mut chief = ps_set(server.addr, &good, 0);
        chief.set_tensor_channel(channel);
        chief.handshake(false).await.unwrap();
        chief.init(&initial(), 0).await.unwrap();
        let grads = vec![ndarray::ArrayD::from_elem(vec![4, 3], 1.0f32), ndarray::ArrayD::from_elem(vec![3], 10.0f32)];
        let mut params = initial();
        let plan = proto::DatasetPlan { examples: 25, shard_size: 10, seed: 3, num_epochs: 1 };
        let ask = chief.shard_request(plan, None, None, true);
        let wrong_plan = chief.shard_request(proto::DatasetPlan { examples: 26, ..plan }, None, None, true);
        let mut answers = Vec::new();
        for (step, call) in [(0, &ask), (1, &wrong_plan)] {
            let stepped = chief
                .push_pull(
                    StepRequest { steps: &[step], push_to: &[true], gradients: &grads, pushed_rows: NO_ROWS, pulled_rows: NO_ROWS, shard_call: Some(call) },
                    &mut params,
                    &[0],
                    Duration::from_secs(1),
                )
                .await
                .unwrap();
            assert!(stepped.pushed[0].accepted, "channel {channel}: the step's push is applied whatever the dispatcher says");
            answers.push(stepped.dispatched.expect("an answer to the call"));
        }
        let handed = answers[0].as_ref().unwrap();
        assert_eq!(handed.outcome, proto::next_shard_reply::Outcome::Assigned as i32, "channel {channel}: {handed:?}");
        let refused = answers[1].as_ref().unwrap_err();
        assert!(refused.contains("dataset plan mismatch"), "channel {channel}: {refused}");
        assert_eq!(server.store.progress().step, 2);
        assert_eq!(server.store.stats().dispatch.unwrap().shards_per_epoch, 3);
    }
}

/// Writes a CA and a task certificate signed by it (for `localhost` and
/// 127.0.0.1) under `dir/name.*`, as a job's TLS files.
fn tls_files(dir: &std::path::Path, name: &str) -> TaskTls {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, format!("tfjob {name} CA"));
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    let files = [(format!("{name}.pem"), cert.pem()), (format!("{name}.key"), key.serialize_pem()), (format!("{name}-ca.pem"), ca.pem())];
    for (file, pem) in &files {
        std::fs::write(dir.join(file), pem).unwrap();
    }
    TaskTls::from_files(&dir.join(&files[0].0), &dir.join(&files[1].0), &dir.join(&files[2].0)).unwrap()
}

/// TLS with a CA and per-task certificates, both sides verifying: pushes
/// and pulls go through, over the tensor channel (inside TLS) and over
/// gRPC; a plaintext client and a client whose certificate another CA
/// signed (with the right token) are refused on both, and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_between_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let tls = Credentials { token: Some("t".into()), tls: Some(tls_files(dir.path(), "job")) };
    let server = start(&tls).await;
    let mut chief = ps_set(server.addr, &tls, 0);
    chief.handshake(false).await.unwrap();
    chief.init(&initial(), 0).await.unwrap();
    let grads = vec![ndarray::ArrayD::from_elem(vec![4, 3], 1.0f32), ndarray::ArrayD::from_elem(vec![3], 10.0f32)];
    for (channel, b) in [(true, vec![0.0, 1.0, 2.0]), (false, vec![-1.0, 0.0, 1.0])] {
        chief.set_tensor_channel(channel);
        assert_eq!(chief.uses_tensor_channel(), channel);
        chief.push(&[server.store.progress().step], &grads, NO_ROWS).await.unwrap();
        let mut params = initial();
        chief.pull(&mut params, NO_ROWS, &[], false, Duration::from_secs(1)).await.unwrap();
        assert_eq!(params[1].as_slice().unwrap(), &b[..], "channel {channel}");
    }
    let foreign = Credentials { token: Some("t".into()), tls: Some(tls_files(dir.path(), "other")) };
    let plain = Credentials { token: Some("t".into()), tls: None };
    for (who, credentials) in [("plaintext", plain), ("another CA's certificate", foreign)] {
        let mut intruder = ps_set(server.addr, &credentials, 1);
        for channel in [true, false] {
            intruder.set_tensor_channel(channel);
            let err = tokio::time::timeout(Duration::from_secs(20), intruder.push(&[2], &grads, NO_ROWS)).await.expect("fails, not hangs").unwrap_err();
            assert!(err.code() != Some(tonic::Code::Ok), "{who}, channel {channel}: {err}");
            let mut params = initial();
            let err = tokio::time::timeout(Duration::from_secs(20), intruder.pull(&mut params, NO_ROWS, &[], false, Duration::from_secs(1)))
                .await
                .expect("fails, not hangs")
                .unwrap_err();
            assert!(err.code() != Some(tonic::Code::Ok), "{who}, channel {channel}: {err}");
            assert_eq!(params, initial());
        }
    }
    assert_eq!(server.store.values("b").unwrap(), vec![-1.0, 0.0, 1.0]);
    assert_eq!(server.store.progress().step, 2);
}

/// Tensors of many TLS records each, both ways, many times over one connection: each pull
/// brings the values the pushes before it made (the unflushed-record hang this once had is
/// pinned by `channel::tests::a_message_over_tls_arrives_whole_through_a_congested_connection`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_moves_large_tensors_over_the_channel() {
    let dir = tempfile::tempdir().unwrap();
    let tls = Credentials { token: Some("t".into()), tls: Some(tls_files(dir.path(), "job")) };
    let server = start(&tls).await;
    let n = 3_000_000;
    let chief = ps_set_of(server.addr, &tls, 0, vec![ModelVariable::dense("big", vec![n])]);
    assert!(chief.uses_tensor_channel());
    chief.handshake(false).await.unwrap();
    chief.init(&[ndarray::ArrayD::from_elem(vec![n], 1.0f32)], 0).await.unwrap();
    let grads = vec![ndarray::ArrayD::from_elem(vec![n], 1.0f32)];
    for round in 0..8 {
        let mut params = vec![ndarray::ArrayD::zeros(vec![n])];
        let pulled = tokio::time::timeout(Duration::from_secs(30), chief.pull(&mut params, NO_ROWS, &[], false, Duration::from_secs(1)))
            .await
            .expect("a pull arrives")
            .unwrap();
        let want = 1.0 - 0.1 * round as f32;
        assert!((params[0][[0]] - want).abs() < 1e-4 && (params[0][[n - 1]] - want).abs() < 1e-4, "round {round}: {}", params[0][[n - 1]]);
        tokio::time::timeout(Duration::from_secs(30), chief.push(&pulled.steps, &grads, NO_ROWS)).await.expect("a push is answered").unwrap();
    }
}

/// One defect, so that the push is malformed whatever else is random.
#[derive(Debug, Clone)]
enum Defect {
    UnknownName(String),
    WrongShape(Vec<i64>),
    WrongDtype(i32),
    RaggedBytes(usize),
    OffsetPastEnd(u64),
    FutureStep(i64),
    NegativeStep(i64),
    Partial,
    NoTask,
    Overlap,
}

fn defect() -> impl Strategy<Value = Defect> {
    prop_oneof![
        "[a-z]{1,8}".prop_filter("not a variable", |s| s != "w" && s != "b").prop_map(Defect::UnknownName),
        prop::collection::vec(-3i64..20, 0..4).prop_filter("not the shape", |s| s != &vec![3]).prop_map(Defect::WrongShape),
        prop_oneof![Just(0), Just(2), Just(3), Just(9), 10..1000i32].prop_map(Defect::WrongDtype),
        (1usize..11).prop_filter("not whole elements", |n| n % 4 != 0).prop_map(Defect::RaggedBytes),
        (1u64..u64::MAX).prop_map(Defect::OffsetPastEnd),
        (1i64..i64::MAX).prop_map(Defect::FutureStep),
        (i64::MIN..0).prop_map(Defect::NegativeStep),
        Just(Defect::Partial),
        Just(Defect::NoTask),
        Just(Defect::Overlap),
    ]
}

fn b_part(values: &[f32], offset: u64) -> TensorPart {
    TensorPart { name: "b".into(), dtype: DataType::DtFloat as i32, shape: vec![3], offset, content: f32_to_bytes(values) }
}

fn malformed(d: &Defect, junk: &[u8]) -> Vec<proto::PushGradientsRequest> {
    let task = Some(proto::TaskId { job: "worker".into(), index: 1 });
    let msg = |part: TensorPart, step: i64| proto::PushGradientsRequest {
        task: task.clone(),
        step,
        push_id: 0,
        part: Some(part),
        abstain: false,
        rows: None,
        layout_version: 0,
        remainder: false,
    };
    let good = b_part(&[1.0, 1.0, 1.0], 0);
    match d {
        Defect::UnknownName(n) => vec![msg(TensorPart { name: n.clone(), ..good }, 0)],
        Defect::WrongShape(s) => vec![msg(TensorPart { shape: s.clone(), ..good }, 0)],
        Defect::WrongDtype(t) => vec![msg(TensorPart { dtype: *t, ..good }, 0)],
        Defect::RaggedBytes(n) => vec![msg(TensorPart { content: Bytes::copy_from_slice(&junk[..*n.min(&junk.len())]), ..good }, 0)],
        Defect::OffsetPastEnd(o) => vec![msg(TensorPart { offset: *o, ..good }, 0)],
        Defect::FutureStep(s) => vec![msg(good, *s)],
        Defect::NegativeStep(s) => vec![msg(good, *s)],
        Defect::Partial => vec![msg(b_part(&[1.0, 1.0], 0), 0)],
        Defect::NoTask => {
            vec![proto::PushGradientsRequest {
                task: None,
                step: 0,
                push_id: 0,
                part: Some(good),
                abstain: false,
                rows: None,
                layout_version: 0,
                remainder: false,
            }]
        }
        Defect::Overlap => vec![msg(b_part(&[1.0, 1.0], 0), 0), msg(b_part(&[1.0, 1.0], 1), 0)],
    }
}

/// Random malformed pushes through the real server: each is refused, the
/// server keeps serving, no variable changes.
#[test]
fn malformed_messages_never_crash_or_change_anything() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let creds = Credentials::default();
    let (server, chief) = rt.block_on(async {
        let server = start(&creds).await;
        let chief = ps_set(server.addr, &creds, 0);
        chief.handshake(false).await.unwrap();
        chief.init(&initial(), 0).await.unwrap();
        (server, chief)
    });
    let _runtime = rt.enter();
    let client = ps_client(&server.addr.to_string(), &creds, Duration::from_secs(5)).unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 200, ..ProptestConfig::default() });
    runner
        .run(&(defect(), prop::collection::vec(any::<u8>(), 16)), |(d, junk)| {
            let messages = malformed(&d, &junk);
            let result = rt.block_on(client.clone().push_gradients(tokio_stream::iter(messages)));
            prop_assert!(result.is_err(), "{d:?} was accepted");
            let code = result.unwrap_err().code();
            prop_assert!(matches!(code, tonic::Code::InvalidArgument | tonic::Code::NotFound | tonic::Code::FailedPrecondition), "{d:?}: {code:?}");
            prop_assert_eq!(server.store.values("b").unwrap(), vec![1.0, 2.0, 3.0]);
            prop_assert_eq!(server.store.values("w").unwrap(), (0..12).map(|i| i as f32).collect::<Vec<_>>());
            Ok(())
        })
        .unwrap();
    // Still serving, and a valid push still applies.
    rt.block_on(async {
        let grads = vec![ndarray::ArrayD::from_elem(vec![4, 3], 0.0f32), ndarray::ArrayD::from_elem(vec![3], 10.0f32)];
        chief.push(&[0], &grads, NO_ROWS).await.unwrap();
    });
    assert_eq!(server.store.values("b").unwrap(), vec![0.0, 1.0, 2.0]);
}

/// One request on a fresh tensor channel connection, by hand: the raw
/// contents follow the request frame. Returns the reply to the request.
fn channel_request(addr: SocketAddr, token: &str, request: &proto::TensorChannelRequest, contents: &[u8]) -> proto::TensorChannelReply {
    use prost::Message;
    use std::io::{Read, Write};
    fn frame(m: &impl Message) -> Vec<u8> {
        let mut out = (m.encoded_len() as u32).to_le_bytes().to_vec();
        m.encode(&mut out).unwrap();
        out
    }
    fn read_reply(s: &mut std::net::TcpStream) -> proto::TensorChannelReply {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut buf).unwrap();
        proto::TensorChannelReply::decode(&buf[..]).unwrap()
    }
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"TFJOBTC1").unwrap();
    s.write_all(&frame(&proto::TensorChannelHello { token: token.into() })).unwrap();
    let hello = read_reply(&mut s);
    assert_eq!(hello.code, 0, "{}", hello.message);
    s.write_all(&frame(request)).unwrap();
    s.write_all(contents).unwrap();
    read_reply(&mut s)
}

/// The ps's one port serves gRPC and the tensor channel side by side; silent,
/// truncated and garbage connections are dropped without disturbing either;
/// malformed pushes on the channel are refused as over gRPC and change
/// nothing; values pulled either way are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_port_serves_grpc_and_the_tensor_channel() {
    use tokio::io::AsyncWriteExt;
    let creds = Credentials { token: Some("tok".into()), tls: None };
    let server = start(&creds).await;
    // A connection that says nothing, one that closes at once, one that
    // stops inside the magic, one with a giant frame, one with junk.
    let _silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    drop(tokio::net::TcpStream::connect(server.addr).await.unwrap());
    let mut cut = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    cut.write_all(b"TFJ").await.unwrap();
    drop(cut);
    for junk in [&b"TFJOBTC1\xff\xff\xff\xff"[..], &b"TFJOBTC1\x03\x00\x00\x00\xff\xff\xff"[..]] {
        let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        s.write_all(junk).await.unwrap();
    }
    let mut chief = ps_set(server.addr, &creds, 0);
    chief.handshake(false).await.unwrap();
    chief.init(&initial(), 0).await.unwrap();
    let grads = vec![ndarray::ArrayD::from_elem(vec![4, 3], 1.0f32), ndarray::ArrayD::from_elem(vec![3], 10.0f32)];
    let mut over_channel = vec![ndarray::ArrayD::zeros(vec![4, 3]), ndarray::ArrayD::zeros(vec![3])];
    let mut over_grpc = over_channel.clone();
    for step in 0..4i64 {
        chief.set_tensor_channel(step % 2 == 0);
        chief.push(&[step], &grads, NO_ROWS).await.unwrap();
        chief.set_tensor_channel(true);
        let a = chief.pull(&mut over_channel, NO_ROWS, &[], false, Duration::from_secs(1)).await.unwrap();
        chief.set_tensor_channel(false);
        let b = chief.pull(&mut over_grpc, NO_ROWS, &[], false, Duration::from_secs(1)).await.unwrap();
        assert_eq!((a.steps[0], b.steps[0], a.bytes, b.bytes), (step + 1, step + 1, 60, 60));
        assert_eq!(over_channel, over_grpc);
        assert_eq!(over_channel[1].as_slice().unwrap(), server.store.values("b").unwrap().as_slice());
    }
    assert_eq!(server.store.values("b").unwrap(), vec![-3.0, -2.0, -1.0]);

    // Malformed pushes, by hand on the channel: refused, nothing changes.
    let before = (server.store.values("w").unwrap(), server.store.values("b").unwrap(), server.store.progress().step);
    let junk = [7u8; 16];
    let defects = [
        Defect::UnknownName("zz".into()),
        Defect::WrongShape(vec![4]),
        Defect::WrongDtype(2),
        Defect::RaggedBytes(5),
        Defect::OffsetPastEnd(9),
        Defect::FutureStep(99),
        Defect::NegativeStep(-1),
        Defect::Partial,
        Defect::NoTask,
        Defect::Overlap,
    ];
    for d in &defects {
        let messages = malformed(d, &junk);
        let mut headers = Vec::new();
        let mut contents = Vec::new();
        for m in &messages {
            let p = m.part.as_ref().unwrap();
            headers.push(proto::RawTensorPart {
                name: p.name.clone(),
                dtype: p.dtype,
                shape: p.shape.clone(),
                offset: p.offset,
                content_length: p.content.len() as u64,
            });
            contents.extend_from_slice(&p.content);
        }
        let first = &messages[0];
        let request = proto::TensorChannelRequest {
            push: Some(proto::PushGradientsRequest {
                task: first.task.clone(),
                step: first.step,
                push_id: 0,
                part: None,
                abstain: false,
                rows: None,
                layout_version: 0,
                remainder: false,
            }),
            push_parts: headers,
            pull: None,
            push_rows: vec![],
            next_shard: None,
        };
        let reply = tokio::task::spawn_blocking({
            let addr = server.addr;
            move || channel_request(addr, "tok", &request, &contents)
        })
        .await
        .unwrap();
        let code = tonic::Code::from(reply.code);
        assert!(matches!(code, tonic::Code::InvalidArgument | tonic::Code::NotFound | tonic::Code::FailedPrecondition), "{d:?}: {code:?}");
    }
    // A push larger than the ps holds is refused before its contents are read.
    let huge = proto::TensorChannelRequest {
        push: Some(proto::PushGradientsRequest {
            task: Some(proto::TaskId { job: "worker".into(), index: 1 }),
            step: 0,
            push_id: 0,
            part: None,
            abstain: false,
            rows: None,
            layout_version: 0,
            remainder: false,
        }),
        push_parts: vec![proto::RawTensorPart { name: "b".into(), dtype: DataType::DtFloat as i32, shape: vec![3], offset: 0, content_length: 1 << 40 }],
        pull: None,
        push_rows: vec![],
        next_shard: None,
    };
    let addr = server.addr;
    let reply = tokio::task::spawn_blocking(move || channel_request(addr, "tok", &huge, &[])).await.unwrap();
    assert_eq!(tonic::Code::from(reply.code), tonic::Code::InvalidArgument, "{}", reply.message);
    assert_eq!((server.store.values("w").unwrap(), server.store.values("b").unwrap(), server.store.progress().step), before);
    // Still serving on both.
    for channel in [true, false] {
        chief.set_tensor_channel(channel);
        let mut params = initial();
        chief.pull(&mut params, NO_ROWS, &[], false, Duration::from_secs(1)).await.unwrap();
        assert_eq!(params, over_grpc);
    }
}
