//! Generates the kubelet's gRPC APIs with tonic-build, the .proto files
//! parsed by protox (in Rust: no `protoc` to install): the device plugin API
//! (proto/deviceplugin/v1beta1), and the plugin registration and DRA APIs
//! the DRA driver speaks (proto/pluginregistration/v1, proto/dra/v1).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    pack_relative_relocations();
    let protos = [
        (
            "proto/deviceplugin/v1beta1/api.proto",
            "proto/deviceplugin/v1beta1",
        ),
        (
            "proto/pluginregistration/v1/api.proto",
            "proto/pluginregistration/v1",
        ),
        ("proto/dra/v1/api.proto", "proto/dra/v1"),
    ];
    for (proto, dir) in protos {
        println!("cargo:rerun-if-changed={proto}");
        let descriptors = protox::compile([proto], [dir])?;
        tonic_build::configure()
            .build_server(true)
            .build_client(true)
            .compile_fds(descriptors)?;
    }
    Ok(())
}

/// enimd's relative relocations, packed (DT_RELR): a position-independent
/// Rust binary carries one 24-byte entry per pointer in its read-only data
/// (over a megabyte for enimd), which the loader reads at every start and
/// which stays resident for the life of the agent. Packed, they take a few
/// kilobytes. Needs binutils 2.38 and glibc 2.36 or later where enimd is
/// built (an older linker ignores the option with a warning); the image
/// carries the C library it was built against.
fn pack_relative_relocations() {
    let var = |k| std::env::var(k).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo:rustc-link-arg-bin=enimd=-Wl,-z,pack-relative-relocs");
    }
}
