//! Reading the JSON of `model.to_json()`: Keras 3 (`"module"`, `"batch_shape"`,
//! `DTypePolicy`, `inbound_nodes` of `__keras_tensor__` args) and Keras 2 /
//! tf.keras (`"batch_input_shape"`, `inbound_nodes` as `[[name, 0, 0, {}]]`),
//! `Sequential` or a `Functional`/`Model` that is a plain chain of layers.
//!
//! Every option of a layer is read: a value this runtime does not compute
//! (a regulariser, a constraint, a dilation, `channels_first`, ...) is an
//! error naming the layer and the option. A key whose value is `null` means
//! "not set" and is accepted whatever its name, so newer Keras versions that
//! add optional keys still load. Initialiser seeds are accepted and not used:
//! initial values come from `--seed`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// What can be wrong with a Keras model definition.
#[derive(Debug, thiserror::Error)]
pub enum KerasError {
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<KerasError>,
    },
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The document is not a model this runtime can read.
    #[error("{0}")]
    Model(String),
    #[error("layer {layer:?}: unsupported layer class {class} (supported: {})", SUPPORTED_LAYERS.join(", "))]
    UnsupportedLayer { layer: String, class: String },
    /// An option of a layer that is missing, malformed or not supported.
    #[error("layer {layer:?} ({class}): {option}: {reason}")]
    Option { layer: String, class: String, option: String, reason: String },
    /// Shapes that do not fit together, or a layer where it cannot be.
    #[error("layer {layer:?} ({class}): {reason}")]
    Layer { layer: String, class: String, reason: String },
}

/// The layer classes this runtime computes.
pub const SUPPORTED_LAYERS: [&str; 10] =
    ["InputLayer", "Dense", "Activation", "Dropout", "Flatten", "Reshape", "Conv2D", "MaxPooling2D", "AveragePooling2D", "Embedding"];

/// An activation function of Dense, Conv2D or Activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Linear,
    Relu,
    Sigmoid,
    Tanh,
    /// Over the last axis.
    Softmax,
}

impl Act {
    pub fn as_str(self) -> &'static str {
        match self {
            Act::Linear => "linear",
            Act::Relu => "relu",
            Act::Sigmoid => "sigmoid",
            Act::Tanh => "tanh",
            Act::Softmax => "softmax",
        }
    }
}

/// `"same"` or `"valid"` padding of Conv2D and the pooling layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    Valid,
    Same,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    Max,
    Average,
}

/// How fan-in and fan-out make the scale of a variance-scaling initialiser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanMode {
    In,
    Out,
    Avg,
}

/// A Keras initialiser, as far as this runtime draws it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InitSpec {
    Zeros,
    Constant(f32),
    /// Uniform(-limit, limit).
    RandomUniform {
        limit: f32,
    },
    RandomNormal {
        stddev: f32,
    },
    TruncatedNormal {
        stddev: f32,
    },
    /// GlorotUniform, HeNormal, LecunUniform, ... are variance scalings.
    VarianceScaling {
        scale: f32,
        mode: FanMode,
        uniform: bool,
    },
}

/// The computation of one layer, with its options.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerKind {
    Dense {
        units: usize,
        activation: Act,
        use_bias: bool,
        kernel_init: InitSpec,
        bias_init: InitSpec,
    },
    Activation(Act),
    Dropout {
        rate: f32,
    },
    Flatten,
    /// `-1` stands for the one dimension to infer.
    Reshape {
        target_shape: Vec<i64>,
    },
    Conv2D {
        filters: usize,
        kernel_size: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
        activation: Act,
        use_bias: bool,
        kernel_init: InitSpec,
        bias_init: InitSpec,
    },
    Pool2D {
        kind: PoolKind,
        pool_size: [usize; 2],
        strides: [usize; 2],
        padding: Padding,
    },
    Embedding {
        input_dim: usize,
        output_dim: usize,
        init: InitSpec,
    },
}

/// One layer of the model definition.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    pub name: String,
    /// The Keras class name (`Dense`, `Conv2D`, ...).
    pub class: String,
    pub kind: LayerKind,
}

/// Which `to_json` wrote the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KerasFormat {
    Keras2,
    Keras3,
}

/// A model definition: the shape of one example and the layers in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub name: String,
    pub format: KerasFormat,
    /// The input shape without the batch dimension (`[28, 28, 1]`).
    pub input_shape: Vec<usize>,
    pub layers: Vec<LayerSpec>,
}

/// Reads a model definition file (the output of `model.to_json()`).
pub fn load_model_file(path: &Path) -> Result<ModelSpec, KerasError> {
    let text = std::fs::read_to_string(path).map_err(|source| KerasError::Io { path: path.to_path_buf(), source })?;
    parse_model_json(&text).map_err(|e| KerasError::InFile { path: path.to_path_buf(), source: Box::new(e) })
}

/// Parses the output of `model.to_json()`.
pub fn parse_model_json(text: &str) -> Result<ModelSpec, KerasError> {
    let doc: Value = serde_json::from_str(text)?;
    let class = doc.get("class_name").and_then(Value::as_str).ok_or_else(|| model_err("no \"class_name\" at the top: not the output of model.to_json()"))?;
    let config = doc.get("config").and_then(Value::as_object).ok_or_else(|| model_err("no \"config\" object at the top"))?;
    // Keras 2 writes "keras_version" at the top, Keras 3 "module".
    let format = if doc.get("keras_version").is_none() && doc.get("module").is_some() { KerasFormat::Keras3 } else { KerasFormat::Keras2 };
    let name = config.get("name").and_then(Value::as_str).unwrap_or("model").to_string();
    let raw_layers = config.get("layers").and_then(Value::as_array).ok_or_else(|| model_err(format!("{class}: no \"layers\" list in \"config\"")))?;
    let ordered: Vec<&Value> = match class {
        "Sequential" => raw_layers.iter().collect(),
        "Functional" | "Model" => chain_order(config, raw_layers)?,
        other => return Err(model_err(format!("model class {other}: only Sequential and Functional (a plain stack of layers) are supported"))),
    };
    let mut input_shape: Option<Vec<usize>> = None;
    let mut layers = Vec::new();
    for (i, raw) in ordered.into_iter().enumerate() {
        let class = raw.get("class_name").and_then(Value::as_str).ok_or_else(|| model_err(format!("layer {i} has no \"class_name\"")))?;
        let empty = Map::new();
        let config = raw.get("config").and_then(Value::as_object).unwrap_or(&empty);
        let layer_name = config.get("name").and_then(Value::as_str).or_else(|| raw.get("name").and_then(Value::as_str)).unwrap_or(class).to_string();
        let mut opts = Options::new(&layer_name, class, config);
        if class == "InputLayer" {
            if i != 0 || input_shape.is_some() {
                return Err(opts.layer_err("an InputLayer can only come first"));
            }
            input_shape = Some(input_layer(&mut opts)?);
            opts.finish()?;
            continue;
        }
        // Keras 2 puts the input shape on the first layer when there is no
        // InputLayer (and copies it, maybe with unknown sizes, elsewhere).
        if layers.is_empty() && input_shape.is_none() {
            input_shape = opts.take_batch_shape("batch_input_shape")?;
        } else {
            opts.take("batch_input_shape");
        }
        let kind = layer_kind(&mut opts, &mut input_shape, layers.is_empty())?;
        opts.finish()?;
        layers.push(LayerSpec { name: layer_name, class: class.to_string(), kind });
    }
    if layers.is_empty() {
        return Err(model_err(format!("model {name:?} has no layers")));
    }
    let mut seen = BTreeSet::new();
    if let Some(dup) = layers.iter().find(|l| !seen.insert(l.name.as_str())) {
        return Err(model_err(format!("two layers are named {:?}", dup.name)));
    }
    if input_shape.is_none() {
        // Keras 3: a Sequential built with model.build(shape) has no InputLayer.
        let mut opts = Options::new(&name, class, config);
        input_shape = opts.take_batch_shape("build_input_shape")?;
    }
    let input_shape =
        input_shape.ok_or_else(|| model_err("the model has no input shape: build it with keras.Input(shape=...) (or give the first layer an input shape)"))?;
    Ok(ModelSpec { name, format, input_shape, layers })
}

fn model_err(reason: impl Into<String>) -> KerasError {
    KerasError::Model(reason.into())
}

/// The layers of a functional model in the order data flows through them,
/// checking that the graph is one chain from one input to one output.
fn chain_order<'a>(config: &Map<String, Value>, layers: &'a [Value]) -> Result<Vec<&'a Value>, KerasError> {
    let endpoint = |key: &str| -> Result<String, KerasError> {
        let v = config.get(key).ok_or_else(|| model_err(format!("functional model without {key:?}")))?;
        // Keras 3 writes one endpoint as ["name", 0, 0], Keras 2 as [["name", 0, 0]].
        let list: Vec<&Value> = match v.as_array() {
            Some(a) if a.first().is_some_and(Value::is_string) => vec![v],
            Some(a) => a.iter().collect(),
            None => vec![],
        };
        match list.as_slice() {
            [one] => one.get(0).and_then(Value::as_str).map(str::to_string).ok_or_else(|| model_err(format!("{key}: malformed: {v}"))),
            _ => Err(model_err(format!(
                "{key}: a model with {} inputs or outputs is not a plain stack of layers (exactly one of each is supported)",
                list.len()
            ))),
        }
    };
    let (first, last) = (endpoint("input_layers")?, endpoint("output_layers")?);
    let name_of = |l: &Value| l.get("name").and_then(Value::as_str).or_else(|| l.pointer("/config/name").and_then(Value::as_str)).unwrap_or("").to_string();
    let by_name: std::collections::HashMap<String, &Value> = layers.iter().map(|l| (name_of(l), l)).collect();
    let mut order = Vec::new();
    let mut current = last.clone();
    loop {
        let layer = by_name.get(&current).ok_or_else(|| model_err(format!("the graph names layer {current:?}, which is not in \"layers\"")))?;
        order.push(*layer);
        if current == first {
            break;
        }
        if order.len() > layers.len() {
            return Err(model_err("the layer graph has a cycle"));
        }
        current = single_inbound(&current, layer)?;
    }
    if order.len() != layers.len() {
        return Err(model_err(format!(
            "the model has {} layers but the chain from {first:?} to {last:?} passes through {}: only a plain stack of layers is supported",
            layers.len(),
            order.len()
        )));
    }
    order.reverse();
    Ok(order)
}

/// The name of the one layer feeding `name` (Keras 2 and 3 node formats).
/// A `training` keyword argument (Keras 3 records Dropout's) is not an
/// input: the runtime decides when dropout applies.
fn single_inbound(name: &str, layer: &Value) -> Result<String, KerasError> {
    let not_chain =
        |what: String| model_err(format!("layer {name:?}: {what}: only a plain stack of layers (one input per layer, each used once) is supported"));
    let nodes = layer.get("inbound_nodes").and_then(Value::as_array).ok_or_else(|| not_chain("no inbound_nodes".into()))?;
    let [node] = nodes.as_slice() else {
        return Err(not_chain(format!("called {} times", nodes.len())));
    };
    // Keras 3: {"args": [{"class_name": "__keras_tensor__", "config": {"keras_history": [name, 0, 0]}}], "kwargs": {}}
    if let Some(obj) = node.as_object() {
        let args = obj.get("args").and_then(Value::as_array).ok_or_else(|| not_chain("a node without args".into()))?;
        if let Some((k, _)) = obj.get("kwargs").and_then(Value::as_object).and_then(|kw| kw.iter().find(|(k, v)| !v.is_null() && *k != "training")) {
            return Err(not_chain(format!("called with the keyword argument {k:?}")));
        }
        let [arg] = args.as_slice() else {
            return Err(not_chain(format!("called on {} tensors", args.len())));
        };
        return arg
            .pointer("/config/keras_history/0")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| not_chain(format!("an input that is not a layer's output: {arg}")));
    }
    // Keras 2: [[name, node_index, tensor_index, kwargs]]
    let tensors = node.as_array().ok_or_else(|| not_chain(format!("malformed node {node}")))?;
    let [tensor] = tensors.as_slice() else {
        return Err(not_chain(format!("called on {} tensors", tensors.len())));
    };
    if let Some((k, _)) = tensor.get(3).and_then(Value::as_object).and_then(|kw| kw.iter().find(|(k, v)| !v.is_null() && *k != "training")) {
        return Err(not_chain(format!("called with the keyword argument {k:?}")));
    }
    tensor.get(0).and_then(Value::as_str).map(str::to_string).ok_or_else(|| not_chain(format!("malformed node {node}")))
}

fn input_layer(opts: &mut Options<'_>) -> Result<Vec<usize>, KerasError> {
    let shape = match opts.take_batch_shape("batch_shape")? {
        Some(s) => s,
        None => opts.take_batch_shape("batch_input_shape")?.ok_or_else(|| opts.option_err("batch_shape", "missing"))?,
    };
    for flag in ["sparse", "ragged", "optional"] {
        if opts.take_bool(flag, false)? {
            return Err(opts.option_err(flag, "must be false"));
        }
    }
    opts.take_dtype("dtype")?;
    Ok(shape)
}

fn layer_kind(opts: &mut Options<'_>, input_shape: &mut Option<Vec<usize>>, first: bool) -> Result<LayerKind, KerasError> {
    opts.take_common()?;
    let kind = match opts.class {
        "Dense" => {
            let units = opts.take_positive("units")?;
            let (activation, use_bias, kernel_init, bias_init) = weights_options(opts)?;
            LayerKind::Dense { units, activation, use_bias, kernel_init, bias_init }
        }
        "Activation" => LayerKind::Activation(opts.take_activation()?),
        "Dropout" => dropout(opts)?,
        "Flatten" => {
            opts.take_channels_last()?;
            LayerKind::Flatten
        }
        "Reshape" => reshape(opts)?,
        "Conv2D" => conv2d(opts)?,
        "MaxPooling2D" | "AveragePooling2D" => {
            let kind = if opts.class == "MaxPooling2D" { PoolKind::Max } else { PoolKind::Average };
            let pool_size = opts.take_pair("pool_size")?.unwrap_or([2, 2]);
            let strides = opts.take_pair("strides")?.unwrap_or(pool_size);
            let padding = opts.take_padding()?;
            opts.take_channels_last()?;
            LayerKind::Pool2D { kind, pool_size, strides, padding }
        }
        "Embedding" => embedding(opts, input_shape, first)?,
        _ => return Err(KerasError::UnsupportedLayer { layer: opts.layer.to_string(), class: opts.class.to_string() }),
    };
    Ok(kind)
}

/// A VarianceScaling initialiser's options: a positive scale, a fan mode,
/// a distribution.
fn variance_scaling(o: &mut Options<'_>, bad: &dyn Fn(String) -> KerasError) -> Result<InitSpec, KerasError> {
    let scale = o.take_f64("scale")?.unwrap_or(1.0);
    let mode = match o.take("mode").and_then(Value::as_str).unwrap_or("fan_in") {
        "fan_in" => FanMode::In,
        "fan_out" => FanMode::Out,
        "fan_avg" => FanMode::Avg,
        m => return Err(bad(format!("mode {m:?} is not supported"))),
    };
    let uniform = match o.take("distribution").and_then(Value::as_str).unwrap_or("truncated_normal") {
        "uniform" => true,
        "truncated_normal" | "normal" => false,
        d => return Err(bad(format!("distribution {d:?} is not supported (uniform, truncated_normal)"))),
    };
    if scale.is_nan() || scale <= 0.0 {
        return Err(bad(format!("scale {scale} must be positive")));
    }
    Ok(InitSpec::VarianceScaling { scale: scale as f32, mode, uniform })
}

/// A RandomUniform initialiser: a range symmetric around 0.
fn random_uniform(o: &mut Options<'_>, bad: &dyn Fn(String) -> KerasError) -> Result<InitSpec, KerasError> {
    let min = o.take_f64("minval")?.unwrap_or(-0.05);
    let max = o.take_f64("maxval")?.unwrap_or(0.05);
    if (min + max).abs() > 1e-12 || max < 0.0 {
        return Err(bad(format!("minval {min}, maxval {max}: only a range symmetric around 0 is supported")));
    }
    Ok(InitSpec::RandomUniform { limit: max as f32 })
}

/// A RandomNormal or TruncatedNormal initialiser: mean 0.
fn random_normal(o: &mut Options<'_>, bad: &dyn Fn(String) -> KerasError, truncated: bool) -> Result<InitSpec, KerasError> {
    let mean = o.take_f64("mean")?.unwrap_or(0.0);
    let stddev = o.take_f64("stddev")?.unwrap_or(0.05);
    if mean != 0.0 {
        return Err(bad(format!("mean {mean}: only 0 is supported")));
    }
    Ok(if truncated { InitSpec::TruncatedNormal { stddev: stddev as f32 } } else { InitSpec::RandomNormal { stddev: stddev as f32 } })
}

/// A Dropout layer: its rate in [0, 1).
fn dropout(opts: &mut Options<'_>) -> Result<LayerKind, KerasError> {
    let rate = opts.take_f64("rate")?.ok_or_else(|| opts.option_err("rate", "missing"))?;
    if !(0.0..1.0).contains(&rate) {
        return Err(opts.option_err("rate", format!("{rate} is not in [0, 1)")));
    }
    opts.take_seed("seed")?;
    Ok(LayerKind::Dropout { rate: rate as f32 })
}

/// A Reshape layer: positive sizes, at most one -1.
fn reshape(opts: &mut Options<'_>) -> Result<LayerKind, KerasError> {
    let target = opts.take("target_shape").ok_or_else(|| opts.option_err("target_shape", "missing"))?;
    let dims = target.as_array().and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>());
    let target_shape = dims
        .filter(|d| d.iter().all(|&v| v > 0 || v == -1))
        .ok_or_else(|| opts.option_err("target_shape", format!("{target} is not a list of positive sizes (and at most one -1)")))?;
    Ok(LayerKind::Reshape { target_shape })
}

/// A Conv2D layer (no dilation, no groups).
fn conv2d(opts: &mut Options<'_>) -> Result<LayerKind, KerasError> {
    let filters = opts.take_positive("filters")?;
    let kernel_size = opts.take_pair("kernel_size")?.ok_or_else(|| opts.option_err("kernel_size", "missing"))?;
    let strides = opts.take_pair("strides")?.unwrap_or([1, 1]);
    let padding = opts.take_padding()?;
    opts.take_channels_last()?;
    if let Some(d) = opts.take_pair("dilation_rate")?.filter(|d| *d != [1, 1]) {
        return Err(opts.option_err("dilation_rate", format!("{d:?}: only 1 is supported")));
    }
    if let Some(g) = opts.take_f64("groups")?.filter(|&g| g != 1.0) {
        return Err(opts.option_err("groups", format!("{g}: only 1 is supported")));
    }
    let (activation, use_bias, kernel_init, bias_init) = weights_options(opts)?;
    Ok(LayerKind::Conv2D { filters, kernel_size, strides, padding, activation, use_bias, kernel_init, bias_init })
}

/// An Embedding layer, the first of its model; Keras 2's `input_length`
/// gives the model's input shape when there is no InputLayer.
fn embedding(opts: &mut Options<'_>, input_shape: &mut Option<Vec<usize>>, first: bool) -> Result<LayerKind, KerasError> {
    if !first {
        return Err(opts.layer_err("an Embedding must be the first layer: its input is the example's integer ids"));
    }
    let input_dim = opts.take_positive("input_dim")?;
    let output_dim = opts.take_positive("output_dim")?;
    let init = opts.take_initializer("embeddings_initializer", InitSpec::RandomUniform { limit: 0.05 })?;
    for key in ["embeddings_regularizer", "activity_regularizer", "embeddings_constraint"] {
        opts.take_none(key)?;
    }
    if opts.take_bool("mask_zero", false)? {
        return Err(opts.option_err("mask_zero", "masking is not supported"));
    }
    if opts.take_bool("sparse", false)? {
        return Err(opts.option_err("sparse", "must be false"));
    }
    // Keras 2: the sequence length, when there is no InputLayer.
    if let Some(len) = opts.take_f64("input_length")? {
        if len < 1.0 || len.fract() != 0.0 {
            return Err(opts.option_err("input_length", format!("{len} is not a positive integer")));
        }
        input_shape.get_or_insert_with(|| vec![len as usize]);
    }
    Ok(LayerKind::Embedding { input_dim, output_dim, init })
}

/// The options Dense and Conv2D share: activation, bias, initialisers, and
/// no regularisers or constraints.
fn weights_options(opts: &mut Options<'_>) -> Result<(Act, bool, InitSpec, InitSpec), KerasError> {
    let activation = opts.take_activation()?;
    let use_bias = opts.take_bool("use_bias", true)?;
    let kernel_init = opts.take_initializer("kernel_initializer", InitSpec::VarianceScaling { scale: 1.0, mode: FanMode::Avg, uniform: true })?;
    let bias_init = opts.take_initializer("bias_initializer", InitSpec::Zeros)?;
    for key in ["kernel_regularizer", "bias_regularizer", "activity_regularizer", "kernel_constraint", "bias_constraint"] {
        opts.take_none(key)?;
    }
    Ok((activation, use_bias, kernel_init, bias_init))
}

/// The config of one layer, read key by key; [`Options::finish`] rejects
/// whatever was not read and is not `null`.
struct Options<'a> {
    layer: &'a str,
    class: &'a str,
    config: &'a Map<String, Value>,
    read: BTreeSet<&'a str>,
    /// Put before option names in errors (`kernel_initializer.` for an initialiser's own options).
    prefix: String,
}

impl<'a> Options<'a> {
    fn new(layer: &'a str, class: &'a str, config: &'a Map<String, Value>) -> Self {
        let mut read = BTreeSet::new();
        read.insert("name");
        Options { layer, class, config, read, prefix: String::new() }
    }

    fn option_err(&self, option: &str, reason: impl Into<String>) -> KerasError {
        KerasError::Option { layer: self.layer.to_string(), class: self.class.to_string(), option: format!("{}{option}", self.prefix), reason: reason.into() }
    }

    fn layer_err(&self, reason: impl Into<String>) -> KerasError {
        KerasError::Layer { layer: self.layer.to_string(), class: self.class.to_string(), reason: reason.into() }
    }

    /// The value of `key`, `None` when absent or `null`.
    fn take(&mut self, key: &'a str) -> Option<&'a Value> {
        self.read.insert(key);
        self.config.get(key).filter(|v| !v.is_null())
    }

    fn finish(self) -> Result<(), KerasError> {
        match self.config.iter().find(|(k, v)| !self.read.contains(k.as_str()) && !v.is_null()) {
            Some((k, v)) => Err(self.option_err(k, format!("{v} is not supported by this runtime"))),
            None => Ok(()),
        }
    }

    /// `name`, `trainable` (must be true) and `dtype` (must be float32).
    fn take_common(&mut self) -> Result<(), KerasError> {
        if !self.take_bool("trainable", true)? {
            return Err(self.option_err("trainable", "false: frozen layers are not supported (every variable is trained)"));
        }
        self.take_dtype("dtype")
    }

    fn take_dtype(&mut self, key: &'a str) -> Result<(), KerasError> {
        let Some(v) = self.take(key) else { return Ok(()) };
        // Keras 3: {"class_name": "DTypePolicy", "config": {"name": "float32"}}.
        let name = v.as_str().or_else(|| v.pointer("/config/name").and_then(Value::as_str));
        match name {
            Some("float32") => Ok(()),
            _ => Err(self.option_err(key, format!("{v}: only float32 is supported"))),
        }
    }

    fn take_bool(&mut self, key: &'a str, default: bool) -> Result<bool, KerasError> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.option_err(key, format!("{v} is not true or false"))),
        }
    }

    fn take_f64(&mut self, key: &'a str) -> Result<Option<f64>, KerasError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.option_err(key, format!("{v} is not a number"))),
        }
    }

    fn take_positive(&mut self, key: &'a str) -> Result<usize, KerasError> {
        let v = self.take(key).ok_or_else(|| self.option_err(key, "missing"))?;
        v.as_u64().filter(|&n| n > 0).map(|n| n as usize).ok_or_else(|| self.option_err(key, format!("{v} is not a positive integer")))
    }

    /// An `int` or a pair of ints (`kernel_size`, `strides`, `pool_size`).
    fn take_pair(&mut self, key: &'a str) -> Result<Option<[usize; 2]>, KerasError> {
        let Some(v) = self.take(key) else { return Ok(None) };
        let positive = |v: &Value| v.as_u64().filter(|&n| n > 0).map(|n| n as usize);
        let pair = match v.as_array() {
            Some(a) if a.len() == 2 => positive(&a[0]).zip(positive(&a[1])).map(|(a, b)| [a, b]),
            Some(_) => None,
            None => positive(v).map(|n| [n, n]),
        };
        pair.map(Some).ok_or_else(|| self.option_err(key, format!("{v} is not a positive integer or a pair of them")))
    }

    /// A batch shape `[null, d1, d2, ...]` with every `d` known.
    fn take_batch_shape(&mut self, key: &'a str) -> Result<Option<Vec<usize>>, KerasError> {
        let Some(v) = self.take(key) else { return Ok(None) };
        let dims = v.as_array().filter(|a| a.len() >= 2).ok_or_else(|| self.option_err(key, format!("{v} is not a batch shape [null, ...]")))?;
        dims[1..]
            .iter()
            .map(|d| d.as_u64().filter(|&n| n > 0).map(|n| n as usize))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or_else(|| self.option_err(key, format!("{v}: every dimension but the batch must be a known positive size")))
    }

    fn take_none(&mut self, key: &'a str) -> Result<(), KerasError> {
        match self.take(key) {
            None => Ok(()),
            Some(v) => Err(self.option_err(key, format!("{v} is not supported (only null)"))),
        }
    }

    /// A seed: accepted, not used (initial values and dropout masks come from `--seed`).
    fn take_seed(&mut self, key: &'a str) -> Result<(), KerasError> {
        match self.take(key) {
            None => Ok(()),
            Some(v) if v.is_i64() || v.is_u64() => Ok(()),
            Some(v) => Err(self.option_err(key, format!("{v} is not an integer seed"))),
        }
    }

    fn take_activation(&mut self) -> Result<Act, KerasError> {
        let Some(v) = self.take("activation") else { return Ok(Act::Linear) };
        match v.as_str() {
            Some("linear") => Ok(Act::Linear),
            Some("relu") => Ok(Act::Relu),
            Some("sigmoid") => Ok(Act::Sigmoid),
            Some("tanh") => Ok(Act::Tanh),
            Some("softmax") => Ok(Act::Softmax),
            _ => Err(self.option_err("activation", format!("{v} is not supported (linear, relu, sigmoid, tanh, softmax)"))),
        }
    }

    fn take_padding(&mut self) -> Result<Padding, KerasError> {
        match self.take("padding").map(|v| (v, v.as_str())) {
            None | Some((_, Some("valid"))) => Ok(Padding::Valid),
            Some((_, Some("same"))) => Ok(Padding::Same),
            Some((v, _)) => Err(self.option_err("padding", format!("{v} is not supported (valid, same)"))),
        }
    }

    fn take_channels_last(&mut self) -> Result<(), KerasError> {
        match self.take("data_format") {
            None => Ok(()),
            Some(v) if v.as_str() == Some("channels_last") => Ok(()),
            Some(v) => Err(self.option_err("data_format", format!("{v}: only channels_last is supported"))),
        }
    }

    /// An initialiser: `{"class_name": ..., "config": {...}}` (Keras 2 and 3)
    /// or a plain name (`"glorot_uniform"`).
    fn take_initializer(&mut self, key: &'a str, default: InitSpec) -> Result<InitSpec, KerasError> {
        let Some(v) = self.take(key) else { return Ok(default) };
        let (class, config) = match v {
            Value::String(s) => (s.as_str(), None),
            _ => match v.get("class_name").and_then(Value::as_str) {
                Some(c) => (c, v.get("config").and_then(Value::as_object)),
                None => return Err(self.option_err(key, format!("{v} is not an initialiser"))),
            },
        };
        let bad = |reason: String| self.option_err(key, format!("{class}: {reason}"));
        let empty = Map::new();
        let mut init_opts = Options::new(self.layer, self.class, config.unwrap_or(&empty));
        init_opts.prefix = format!("{key}.");
        init_opts.read.remove("name");
        let vs = |scale: f32, mode: FanMode, uniform: bool| InitSpec::VarianceScaling { scale, mode, uniform };
        let spec = match normalise(class).as_str() {
            "zeros" => InitSpec::Zeros,
            "ones" => InitSpec::Constant(1.0),
            "constant" => InitSpec::Constant(init_opts.take_f64("value")?.unwrap_or(0.0) as f32),
            "glorotuniform" => vs(1.0, FanMode::Avg, true),
            "glorotnormal" => vs(1.0, FanMode::Avg, false),
            "heuniform" => vs(2.0, FanMode::In, true),
            "henormal" => vs(2.0, FanMode::In, false),
            "lecununiform" => vs(1.0, FanMode::In, true),
            "lecunnormal" => vs(1.0, FanMode::In, false),
            "variancescaling" => variance_scaling(&mut init_opts, &bad)?,
            "randomuniform" => random_uniform(&mut init_opts, &bad)?,
            c @ ("randomnormal" | "truncatednormal") => random_normal(&mut init_opts, &bad, c == "truncatednormal")?,
            _ => return Err(bad("not supported (Zeros, Ones, Constant, GlorotUniform, GlorotNormal, HeUniform, HeNormal, LecunUniform, LecunNormal, VarianceScaling, RandomUniform, RandomNormal, TruncatedNormal)".into())),
        };
        init_opts.take_seed("seed")?;
        init_opts.finish()?;
        Ok(spec)
    }
}

/// `GlorotUniform`, `glorot_uniform` -> `glorotuniform`.
fn normalise(class: &str) -> String {
    class.chars().filter(|c| *c != '_').flat_map(char::to_lowercase).collect()
}
