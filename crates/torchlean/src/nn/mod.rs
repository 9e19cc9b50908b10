//! The `nn` layer: modules, losses, optimizers, training.
