# Spark's part of the launch scripts (spark_cluster.sh, submit_spark.sh): the distribution, Beam's
# Spark job server jar and the JVM flags it needs. Sourced after _common.sh, never run.

# The pairing, pinned once in the job server's pom.xml: the Spark release of the cluster (the job
# server's own Spark must be the same: a 3.2 driver against a 3.5 master failed to deserialise the
# application's description) and the Beam Java runner release the job server is built from.
ITT_SPARK_JOB_SERVER_POM="$ITT_REPO_ROOT/launch/spark_job_server/pom.xml"
itt_spark_pom_property() { sed -n "s:.*<$1>\([^<]*\)</$1>.*:\1:p" "$ITT_SPARK_JOB_SERVER_POM" | head -1; }
ITT_SPARK_VERSION_DEFAULT=$(itt_spark_pom_property spark.version)
ITT_SPARK_BEAM_RUNNER_VERSION_DEFAULT=$(itt_spark_pom_property beam.version)

# What spark-submit adds to every Spark JVM on Java 17 (Spark's launcher JavaModuleOptions): a job
# server started with plain `java` lacks them and fails in Spark's first reflective access.
ITT_SPARK_JAVA_OPTIONS=(-XX:+IgnoreUnrecognizedVMOptions
  --add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED --add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/sun.nio.cs=ALL-UNNAMED
  --add-opens=java.base/sun.security.action=ALL-UNNAMED --add-opens=java.base/sun.util.calendar=ALL-UNNAMED
  -Djdk.reflect.useDirectMethodHandle=false)

# itt_ensure_spark_dist VERSION: prints SPARK_HOME of a Spark distribution: PyPI's pyspark, which
# ships Spark's jars and bin/spark-class (files only, --no-deps, into the cache, never the venv).
itt_ensure_spark_dist() {
  local version=$1 root
  root="$(itt_cache_dir)/spark-$version"
  if [[ ! -x "$root/pyspark/bin/spark-class" || ! -f "$root/pyspark/jars/spark-core_2.12-$version.jar" ]]; then
    command -v java >/dev/null || itt_die "Spark needs Java (11 or 17) on PATH"
    itt_pip_files_into_cache "$root" "Spark $version (pyspark)" "pyspark==$version"
    chmod +x "$root"/pyspark/bin/*
  fi
  printf '%s\n' "$root/pyspark"
}

itt_spark_job_server_jar_name() { printf 'beam-runners-spark-3-job-server-%s-spark-%s.jar\n' "$2" "$1"; }

# itt_ensure_spark_job_server_jar SPARK_VERSION BEAM_RUNNER_VERSION: prints the path of Beam's
# Spark job server jar, $SPARK_JOB_SERVER_JAR when set. Otherwise built once into the cache from
# launch/spark_job_server/pom.xml (profile bundle-spark: Beam's beam-runners-spark-3 with the same
# Spark as the cluster, all from Maven Central; a 271 MB jar, about a minute of CPU).
itt_ensure_spark_job_server_jar() {
  local spark=$1 beam=$2 name dir jar build
  if [[ -n "${SPARK_JOB_SERVER_JAR:-}" ]]; then
    printf '%s\n' "$SPARK_JOB_SERVER_JAR"
    return 0
  fi
  name=$(itt_spark_job_server_jar_name "$spark" "$beam")
  dir="$(itt_cache_dir)/jars"
  jar="$dir/$name"
  if [[ ! -s "$jar" ]]; then
    itt_need_java "building Beam's Spark job server"
    command -v mvn >/dev/null 2>&1 \
      || itt_die "Maven is missing: mvn builds Beam's Spark job server once (e.g. apt-get install maven), or set SPARK_JOB_SERVER_JAR to a jar built elsewhere"
    mkdir -p "$dir"
    build=$(mktemp -d "$dir/.build-spark-$spark-$beam.XXXXXX")
    cp "$ITT_SPARK_JOB_SERVER_POM" "$build/pom.xml"
    itt_log "building $name from org.apache.beam:beam-runners-spark-3:$beam and Spark $spark (Maven Central) into $dir; first run only, about a minute of CPU"
    if ! (cd "$build" && mvn --batch-mode --quiet -Pbundle-spark "-Dspark.version=$spark" "-Dbeam.version=$beam" package) \
        >"$build/mvn.log" 2>&1; then
      tail -n 15 "$build/mvn.log" >&2
      itt_die "Maven could not build $name (full log: $build/mvn.log)"
    fi
    # Renamed into place only when complete, so a killed build never leaves a truncated jar.
    mv "$build/target/$name" "$jar.tmp.$$"
    mv "$jar.tmp.$$" "$jar"
    rm -rf "$build"
  fi
  printf '%s\n' "$jar"
}
