//! tfjob-operator: the TFJob API, its planning code and its controller.
