pub mod bench;
pub mod capsules;
pub mod examples;
pub mod graph_files;
pub mod ops;
pub mod plan;
pub mod quickstart_mlp;
pub mod quickstart_tour;
